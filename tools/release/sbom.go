package release

import (
	"bytes"
	"cmp"
	"debug/buildinfo"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

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

// writeSBOM writes one platform's SPDX 2.3 document beside the archive
// (IMAGE.OS-ARCH.spdx.json): the image, every Go module its programs (the layout's Bin files)
// were built from at the version their build info records (the Go standard library as "stdlib"
// at the toolchain's version; our main module at o.Version where it says "(devel)"), and every
// Debian package at its version. The same inputs give the same document.
func writeSBOM(dir string, b *images.Built, pi images.PlatformImage, o Options) (ReleasedPlatform, error) {
	plat := pi.Platform.OS + "/" + pi.Platform.Architecture
	digest, err := pi.Image.Digest()
	if err != nil {
		return ReleasedPlatform{}, err
	}
	m, err := pi.Image.Manifest()
	if err != nil {
		return ReleasedPlatform{}, err
	}
	size := m.Config.Size
	for _, l := range m.Layers {
		size += l.Size
	}
	ref, repo, tag := b.Image.Ref(b.Tag), b.Image.Repository, b.Tag+b.Image.TagSuffix
	imageID := common.ElementID("Image")
	doc := &spdx.Document{
		SPDXVersion:       spdx.Version,
		DataLicense:       spdx.DataLicense,
		SPDXIdentifier:    "DOCUMENT",
		DocumentName:      ref + " " + plat,
		DocumentNamespace: "https://github.com/kubemesh/proxy-init/spdx/" + repo + "/" + tag + "/" + digest.String(),
		CreationInfo: &spdx.CreationInfo{
			Creators: []common.Creator{{CreatorType: "Tool", Creator: "kubemesh-proxy-init-release-" + o.Version}},
			Created:  o.Epoch.UTC().Format(time.RFC3339),
		},
		Relationships: []*spdx.Relationship{{
			RefA: common.MakeDocElementID("", "DOCUMENT"), RefB: common.MakeDocElementID("", string(imageID)), Relationship: common.TypeRelationshipDescribe,
		}},
	}
	name := repo[strings.LastIndex(repo, "/")+1:]
	doc.Packages = append(doc.Packages, pkg(imageID, repo, tag, "CONTAINER",
		fmt.Sprintf("pkg:oci/%s@%s?arch=%s&repository_url=%s&tag=%s", name, digest, pi.Platform.Architecture, repo, tag)))
	add := func(id, name, version, purpose, purl string) {
		doc.Packages = append(doc.Packages, pkg(common.ElementID(id), name, version, purpose, purl))
		doc.Relationships = append(doc.Relationships, &spdx.Relationship{
			RefA: common.MakeDocElementID("", string(imageID)), RefB: common.MakeDocElementID("", id), Relationship: common.TypeRelationshipContains,
		})
	}
	mods, err := goModules(pi.BinDir, b.Image.Files)
	if err != nil {
		return ReleasedPlatform{}, fmt.Errorf("image %s (%s): %w", b.Image.Name, plat, err)
	}
	for _, m := range mods {
		purpose := "LIBRARY"
		if m.main {
			purpose = "APPLICATION"
			if m.version == "(devel)" || m.version == "" {
				m.version = o.Version
			}
		}
		add("Go-"+spdxID(m.path+"-"+m.version), m.path, m.version, purpose, "pkg:golang/"+m.path+"@"+m.version)
	}
	distro := Distro()
	for _, d := range pi.Debian {
		purl := fmt.Sprintf("pkg:deb/debian/%s@%s?arch=%s", d.Name, strings.ReplaceAll(d.Version, ":", "%3A"), d.Arch)
		if distro != "" {
			purl += "&distro=" + distro
		}
		add("Deb-"+spdxID(d.Name+"-"+d.Version+"-"+d.Arch), d.Name, d.Version, "", purl)
	}
	var data bytes.Buffer
	if err := spdxjson.Write(doc, &data, spdxjson.Indent("  "), spdxjson.EscapeHTML(false)); err != nil {
		return ReleasedPlatform{}, fmt.Errorf("write SPDX JSON: %w", err)
	}
	p := filepath.Join(dir, b.Image.Name+"."+strings.ReplaceAll(plat, "/", "-")+".spdx.json")
	if err := os.WriteFile(p, data.Bytes(), 0o644); err != nil {
		return ReleasedPlatform{}, err
	}
	return ReleasedPlatform{Platform: plat, Digest: digest, SBOM: p, Size: size}, nil
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

// goModules reads the build info of the programs (the Bin files) in dir: their main module,
// every dependency (a replacement as the module it is replaced with) and the standard library,
// each once.
func goModules(dir string, files []images.File) ([]goModule, error) {
	seen := map[string]goModule{}
	for _, f := range files {
		if f.Bin == "" {
			continue
		}
		file := filepath.Join(dir, f.Bin)
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
	return slices.SortedFunc(maps.Values(seen), func(a, b goModule) int {
		return cmp.Or(strings.Compare(a.path, b.path), strings.Compare(a.version, b.version))
	}), nil
}

// Distro returns the building machine's Debian release as a purl names it ("debian-12"), the
// release the private apt directory fetches from (FetchDebs uses the machine's sources), or ""
// when /etc/os-release does not say.
func Distro() string {
	b, _ := os.ReadFile("/etc/os-release")
	kv := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, "=")
		kv[k] = strings.Trim(v, `"`)
	}
	if kv["ID"] == "" || kv["VERSION_ID"] == "" {
		return ""
	}
	return kv["ID"] + "-" + kv["VERSION_ID"]
}
