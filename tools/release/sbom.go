package release

import (
	"bytes"
	"debug/buildinfo"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdx/v2/common"
	spdx "github.com/spdx/tools-golang/spdx/v2/v2_3"

	"github.com/kubemesh/proxy-init/tools/images"
)

// SBOMArtifactType is the media type of an SBOM document, and the artifact type of its referrer
// in a registry (the one scanners such as Trivy look for).
const SBOMArtifactType = "application/spdx+json"

// noAssertion is SPDX's "we do not say".
const noAssertion = "NOASSERTION"

// SBOMInput is what one platform's SBOM describes.
type SBOMInput struct {
	// Ref is the image's name (repository:tag) and Digest its platform manifest's digest.
	Ref    string
	Digest v1.Hash
	Image  images.PlatformImage
	// Programs are the image's Go binaries (the layout's Bin files), read for their build info.
	Programs []string
	// Distro is the Debian release the packages come from, as in a purl ("debian-12").
	Distro  string
	Created time.Time
	// Version is the release: our main module's version where the build info says "(devel)"
	// (a build from a checkout), and the creator's (kubemesh-proxy-init-release-VERSION).
	Version string
}

// SBOM returns the SPDX 2.3 document of one platform's image: the image, every Go module its
// programs were built from at the version their build info records (the Go standard library
// as "stdlib" at the toolchain's version), and every Debian package at its version. The same
// inputs give the same document.
func SBOM(in SBOMInput) (*spdx.Document, error) {
	plat := in.Image.Platform.OS + "/" + in.Image.Platform.Architecture
	repo, tag := splitTag(in.Ref)
	imageID := common.ElementID("Image")
	doc := &spdx.Document{
		SPDXVersion:       spdx.Version,
		DataLicense:       spdx.DataLicense,
		SPDXIdentifier:    "DOCUMENT",
		DocumentName:      in.Ref + " " + plat,
		DocumentNamespace: "https://github.com/kubemesh/proxy-init/spdx/" + repo + "/" + tag + "/" + in.Digest.String(),
		CreationInfo: &spdx.CreationInfo{
			Creators: []common.Creator{{CreatorType: "Tool", Creator: "kubemesh-proxy-init-release-" + in.Version}},
			Created:  in.Created.UTC().Format(time.RFC3339),
		},
		Relationships: []*spdx.Relationship{{
			RefA: common.MakeDocElementID("", "DOCUMENT"), RefB: common.MakeDocElementID("", string(imageID)), Relationship: common.TypeRelationshipDescribe,
		}},
	}
	name := repo[strings.LastIndex(repo, "/")+1:]
	doc.Packages = append(doc.Packages, pkg(imageID, repo, tag, "CONTAINER",
		fmt.Sprintf("pkg:oci/%s@%s?arch=%s&repository_url=%s&tag=%s", name, in.Digest, in.Image.Platform.Architecture, repo, tag)))
	add := func(id, name, version, purpose, purl string) {
		doc.Packages = append(doc.Packages, pkg(common.ElementID(id), name, version, purpose, purl))
		doc.Relationships = append(doc.Relationships, &spdx.Relationship{
			RefA: common.MakeDocElementID("", string(imageID)), RefB: common.MakeDocElementID("", id), Relationship: common.TypeRelationshipContains,
		})
	}
	mods, err := goModules(in.Image.BinDir, in.Programs)
	if err != nil {
		return nil, err
	}
	for _, m := range mods {
		purpose := "LIBRARY"
		if m.main {
			purpose = "APPLICATION"
			if m.version == "(devel)" || m.version == "" {
				m.version = in.Version
			}
		}
		add("Go-"+spdxID(m.path+"-"+m.version), m.path, m.version, purpose, "pkg:golang/"+m.path+"@"+m.version)
	}
	for _, d := range in.Image.Debian {
		purl := fmt.Sprintf("pkg:deb/debian/%s@%s?arch=%s", d.Name, strings.ReplaceAll(d.Version, ":", "%3A"), d.Arch)
		if in.Distro != "" {
			purl += "&distro=" + in.Distro
		}
		add("Deb-"+spdxID(d.Name+"-"+d.Version+"-"+d.Arch), d.Name, d.Version, "", purl)
	}
	return doc, nil
}

// pkg is one SPDX package that says nothing it does not know.
func pkg(id common.ElementID, name, version, purpose, purl string) *spdx.Package {
	return &spdx.Package{
		PackageName: name, PackageSPDXIdentifier: id, PackageVersion: version,
		PackageDownloadLocation: noAssertion, PackageLicenseConcluded: noAssertion,
		PackageLicenseDeclared: noAssertion, PackageCopyrightText: noAssertion,
		PrimaryPackagePurpose: purpose,
		PackageExternalReferences: []*spdx.PackageExternalReference{{
			Category: common.CategoryPackageManager, RefType: common.TypePackageManagerPURL, Locator: purl,
		}},
	}
}

var notSPDXID = regexp.MustCompile(`[^A-Za-z0-9.-]+`)

// spdxID makes s an SPDX identifier (letters, digits, dots and dashes).
func spdxID(s string) string { return notSPDXID.ReplaceAllString(s, "-") }

type goModule struct {
	path, version string
	main          bool
}

// goModules reads the build info of the programs in dir: their main module, every dependency
// (a replacement as the module it is replaced with) and the standard library, each once.
func goModules(dir string, programs []string) ([]goModule, error) {
	seen := map[string]goModule{}
	for _, p := range programs {
		file := filepath.Join(dir, p)
		bi, err := buildinfo.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("read the Go build info of %s: %w", file, err)
		}
		seen["stdlib@"+bi.GoVersion] = goModule{path: "stdlib", version: bi.GoVersion}
		seen[bi.Main.Path+"@"+bi.Main.Version] = goModule{path: bi.Main.Path, version: bi.Main.Version, main: true}
		for _, d := range bi.Deps {
			if d.Replace != nil {
				d = d.Replace
			}
			seen[d.Path+"@"+d.Version] = goModule{path: d.Path, version: d.Version}
		}
	}
	mods := make([]goModule, 0, len(seen))
	for _, m := range seen {
		mods = append(mods, m)
	}
	sort.Slice(mods, func(i, j int) bool {
		if mods[i].path != mods[j].path {
			return mods[i].path < mods[j].path
		}
		return mods[i].version < mods[j].version
	})
	return mods, nil
}

// MarshalSBOM is the document as indented SPDX JSON.
func MarshalSBOM(doc *spdx.Document) ([]byte, error) {
	var b bytes.Buffer
	if err := spdxjson.Write(doc, &b, spdxjson.Indent("  "), spdxjson.EscapeHTML(false)); err != nil {
		return nil, fmt.Errorf("write SPDX JSON: %w", err)
	}
	return b.Bytes(), nil
}

// Distro returns the building machine's Debian release as a purl names it ("debian-12"), the
// release the private apt directory fetches from (FetchDebs uses the machine's sources), or ""
// when /etc/os-release does not say.
func Distro() string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return ""
	}
	var id, version string
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, "=")
		v = strings.Trim(v, `"`)
		switch k {
		case "ID":
			id = v
		case "VERSION_ID":
			version = v
		}
	}
	if id == "" || version == "" {
		return ""
	}
	return id + "-" + version
}
