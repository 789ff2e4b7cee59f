package release

import (
	"bufio"
	"bytes"
	"context"
	"crypto/elliptic"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	spdxjson "github.com/spdx/tools-golang/json"
	"github.com/spdx/tools-golang/spdxlib"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/kubemesh/proxy-init/test/helmchart"
	"github.com/kubemesh/proxy-init/tools/images"
)

// testVersion is the release the tests make; buildBins stamps the binaries with it.
const testVersion = "v0.3.0-rc.1"

// writeKey writes a cosign key pair (generate-key-pair's format, encrypted with password) and
// returns the private key's path and the public key's.
func writeKey(t *testing.T, password string) (string, string) {
	t.Helper()
	priv, pub, err := cryptoutils.GeneratePEMEncodedECDSAKeyPair(elliptic.P256(), func(bool) ([]byte, error) { return []byte(password), nil })
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cosign.key"), priv, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cosign.pub"), pub, 0o644); err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "cosign.key"), filepath.Join(dir, "cosign.pub")
}

func releaseOptions(t *testing.T, bin, host string) Options {
	return Options{
		Version: testVersion, BinDir: bin, Platforms: images.Platforms, Out: t.TempDir(), RepoDir: repoRoot,
		DebCache: os.Getenv("DEB_CACHE"), Epoch: epoch, Registry: host, Remote: loopbackOnly, Logf: t.Logf,
	}
}

// TestRelease runs a signed release into a registry in the test process, one with the referrers
// API and one without (the sha256-<digest> tag fallback), and checks what a user pulls: the
// files and their SHA256SUMS, each image's index and platforms, each platform's SBOM as its
// referrer (the same document as the file beside the archive) listing the Go modules and Debian
// packages at their versions, the signature of every image and SBOM digest (and none for a
// changed one), and the chart at the release's version, defaulting to the release's image.
func TestRelease(t *testing.T) {
	bin := buildBins(t)
	key, pubFile := writeKey(t, "s3cret")
	for _, referrers := range []bool{true, false} {
		t.Run(map[bool]string{true: "referrers-api", false: "tag-fallback"}[referrers], func(t *testing.T) {
			host := startRegistry(t, referrers)
			o := releaseOptions(t, bin, host+"/kubemesh")
			o.KeyFile, o.Password = key, []byte("s3cret")
			res, err := Run(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			checkSums(t, o.Out)
			verifier, err := LoadVerifier(pubFile)
			if err != nil {
				t.Fatal(err)
			}
			if written, _ := os.ReadFile(res.PublicKey); !bytes.Equal(written, mustRead(t, pubFile)) {
				t.Errorf("%s is not the key's public half", res.PublicKey)
			}
			digests := string(mustRead(t, filepath.Join(o.Out, DigestsFile)))
			if len(res.Images) != len(images.Images) {
				t.Fatalf("%d images released, want %d", len(res.Images), len(images.Images))
			}
			for i, r := range res.Images {
				img := images.Images[i]
				wantRef := host + "/kubemesh/" + filepath.Base(img.Repository) + ":" + testVersion + img.TagSuffix
				if r.Ref != wantRef || !strings.Contains(digests, r.Ref+"@"+r.Digest.String()+"\n") {
					t.Errorf("released %s@%s, want %s, listed in %s:\n%s", r.Ref, r.Digest, wantRef, DigestsFile, digests)
				}
				checkPushedImage(t, img, r, verifier)
			}
			checkChart(t, res, host)
			if err := Verify(context.Background(), res.ChartDigest, verifier, loopbackOnly...); err != nil {
				t.Errorf("the chart: %v", err)
			}
		})
	}
}

func mustRead(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// checkSums holds SHA256SUMS to every other file of the release directory.
func checkSums(t *testing.T, dir string) {
	t.Helper()
	listed := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(mustRead(t, filepath.Join(dir, SumsFile))))
	for sc.Scan() {
		sum, file, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			t.Fatalf("%s: bad line %q", SumsFile, sc.Text())
		}
		listed[file] = sum
	}
	var files []string
	filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, rel)
		}
		return err
	})
	for _, want := range []string{"images/proxy-init.tar", "images/proxy-init.linux-arm64.spdx.json", "linkerd2-cni-0.3.0-rc.1.tgz", DigestsFile, PublicKeyFile} {
		if !slices.Contains(files, want) {
			t.Errorf("the release lacks %s (has %v)", want, files)
		}
	}
	for _, f := range files {
		if f == SumsFile {
			continue
		}
		h := sha256.Sum256(mustRead(t, filepath.Join(dir, f)))
		if listed[f] != hex.EncodeToString(h[:]) {
			t.Errorf("%s: SHA256SUMS says %q, the file is %x", f, listed[f], h)
		}
		delete(listed, f)
	}
	if len(listed) > 0 {
		t.Errorf("SHA256SUMS lists files that are not there: %v", listed)
	}
}

// goModuleVersions are the versions go.mod pins for a few of our dependencies.
func goModuleVersions(t *testing.T, mods ...string) map[string]string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-m", "-f", "{{.Path}} {{.Version}}"}, mods...)...)
	cmd.Dir = repoRoot
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	v := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		p, ver, _ := strings.Cut(line, " ")
		v[p] = ver
	}
	return v
}

// checkPushedImage pulls one released image and checks its platforms, SBOM referrers and
// signatures.
func checkPushedImage(t *testing.T, img images.Image, r Released, verifier signature.Verifier) {
	t.Helper()
	ctx := context.Background()
	tag, err := name.NewTag(r.Ref)
	if err != nil {
		t.Fatal(err)
	}
	idx, err := remote.Index(tag, loopbackOnly...)
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := idx.Digest(); d != r.Digest {
		t.Errorf("%s is %s in the registry, %s in the release", r.Ref, d, r.Digest)
	}
	im, _ := idx.IndexManifest()
	if len(im.Manifests) != len(images.Platforms) || len(r.Platforms) != len(images.Platforms) {
		t.Fatalf("%s: %d platforms pushed, %d released, want %v", r.Ref, len(im.Manifests), len(r.Platforms), images.Platforms)
	}
	repo := tag.Context()
	if err := Verify(ctx, repo.Digest(r.Digest.String()), verifier, loopbackOnly...); err != nil {
		t.Errorf("the index: %v", err)
	}
	want := goModuleVersions(t, "github.com/google/nftables", "github.com/spf13/pflag", "golang.org/x/sys")
	if img.Name == "linkerd-cni" {
		want = goModuleVersions(t, "github.com/containernetworking/cni", "k8s.io/client-go", "github.com/fsnotify/fsnotify")
	}
	want["github.com/kubemesh/proxy-init"] = testVersion
	for i, rp := range r.Platforms {
		arch := rp.Platform[strings.Index(rp.Platform, "/")+1:]
		d := im.Manifests[i]
		if d.Digest != rp.Digest || d.Platform == nil || d.Platform.Architecture != arch {
			t.Errorf("%s entry %d: %s %+v, want %s %s", r.Ref, i, d.Digest, d.Platform, rp.Digest, rp.Platform)
		}
		subject := repo.Digest(rp.Digest.String())
		if err := Verify(ctx, subject, verifier, loopbackOnly...); err != nil {
			t.Errorf("%s: %v", rp.Platform, err)
		}
		// The SBOM: one referrer of the platform's image, the file written beside the archive.
		refs, err := remote.Referrers(subject, loopbackOnly...)
		if err != nil {
			t.Fatal(err)
		}
		rm, _ := refs.IndexManifest()
		// go-containerregistry's registry names a referrer by its configuration's media type,
		// not by the manifest's artifactType as the distribution spec (and the tag fallback)
		// do: the manifest's own artifactType is checked below.
		if len(rm.Manifests) != 1 || (rm.Manifests[0].ArtifactType != SBOMArtifactType && rm.Manifests[0].ArtifactType != string(types.OCIEmptyJSON)) {
			t.Fatalf("%s %s: referrers %+v, want one %s", r.Ref, rp.Platform, rm.Manifests, SBOMArtifactType)
		}
		sbom := repo.Digest(rm.Manifests[0].Digest.String())
		if err := Verify(ctx, sbom, verifier, loopbackOnly...); err != nil {
			t.Errorf("%s SBOM: %v", rp.Platform, err)
		}
		art, err := remote.Image(sbom, loopbackOnly...)
		if err != nil {
			t.Fatal(err)
		}
		am, _ := art.Manifest()
		if am.Subject == nil || am.Subject.Digest != rp.Digest || am.ArtifactType != SBOMArtifactType || len(am.Layers) != 1 {
			t.Fatalf("SBOM manifest %+v: want subject %s, artifact type %s, one layer", am, rp.Digest, SBOMArtifactType)
		}
		layers, _ := art.Layers()
		rc, err := layers[0].Compressed()
		if err != nil {
			t.Fatal(err)
		}
		pushed, _ := io.ReadAll(rc)
		rc.Close()
		if !bytes.Equal(pushed, mustRead(t, rp.SBOM)) {
			t.Errorf("%s: the pushed SBOM is not %s", rp.Platform, rp.SBOM)
		}
		doc, err := spdxjson.Read(bytes.NewReader(pushed))
		if err != nil {
			t.Fatal(err)
		}
		if err := spdxlib.ValidateDocument(doc); err != nil {
			t.Errorf("%s: SPDX: %v", rp.SBOM, err)
		}
		if doc.SPDXVersion != "SPDX-2.3" {
			t.Errorf("%s: %s, want SPDX-2.3", rp.SBOM, doc.SPDXVersion)
		}
		got := map[string]string{}
		purls := map[string]string{}
		for _, p := range doc.Packages {
			got[p.PackageName] = p.PackageVersion
			if len(p.PackageExternalReferences) == 1 {
				purls[p.PackageName] = p.PackageExternalReferences[0].Locator
			}
		}
		for mod, v := range want {
			if got[mod] != v || purls[mod] != "pkg:golang/"+mod+"@"+v {
				t.Errorf("%s: %s at %q (%s), want %s", rp.SBOM, mod, got[mod], purls[mod], v)
			}
		}
		// Every Debian package at the version the image's label records.
		pi, _ := idx.Image(rp.Digest)
		cf, _ := pi.ConfigFile()
		for _, pv := range strings.Fields(cf.Config.Labels[images.LabelDebian]) {
			pkg, ver, _ := strings.Cut(pv, "=")
			if got[pkg] != ver || !strings.HasPrefix(purls[pkg], "pkg:deb/debian/"+pkg+"@") || !(strings.Contains(purls[pkg], "arch="+arch) || strings.Contains(purls[pkg], "arch=all")) {
				t.Errorf("%s: Debian package %s at %q (%s), want %s for %s", rp.SBOM, pkg, got[pkg], purls[pkg], ver, arch)
			}
		}
		if len(img.Debian) > 0 && len(strings.Fields(cf.Config.Labels[images.LabelDebian])) != len(img.Debian) {
			t.Errorf("%s: label %q, want every one of %v", rp.Platform, cf.Config.Labels[images.LabelDebian], img.Debian)
		}
	}
	// A digest nobody signed has no signature; a signature moved to another digest's tag names
	// the digest it signed, and fails.
	other, _, _ := v1.SHA256(strings.NewReader(r.Digest.String()))
	if err := Verify(ctx, repo.Digest(other.String()), verifier, loopbackOnly...); !errors.Is(err, ErrNoSignature) {
		t.Errorf("an unsigned digest: %v, want %v", err, ErrNoSignature)
	}
	sig, err := remote.Image(signatureTag(repo.Digest(r.Digest.String())), loopbackOnly...)
	if err != nil {
		t.Fatal(err)
	}
	moved := repo.Digest(other.String())
	if err := remote.Write(signatureTag(moved), sig, loopbackOnly...); err != nil {
		t.Fatal(err)
	}
	wantErr := moved.String() + ": no signature verifies: layer "
	if err := Verify(ctx, moved, verifier, loopbackOnly...); err == nil || !strings.HasPrefix(err.Error(), wantErr) || !strings.HasSuffix(err.Error(), ": signs "+repo.Digest(r.Digest.String()).String()+", not "+moved.String()) {
		t.Errorf("a moved signature: %v, want %q...", err, wantErr)
	}
}

// checkChart pulls the chart with Helm's registry client: the release's version, and the
// release's image by default.
func checkChart(t *testing.T, res *Result, host string) {
	t.Helper()
	wantRef := "oci://" + host + "/kubemesh/linkerd2-cni:0.3.0-rc.1"
	if res.ChartRef != wantRef {
		t.Errorf("chart pushed to %s, want %s", res.ChartRef, wantRef)
	}
	c, err := registry.NewClient(registry.ClientOptPlainHTTP())
	if err != nil {
		t.Fatal(err)
	}
	pulled, err := c.Pull(strings.TrimPrefix(wantRef, "oci://"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(pulled.Chart.Data, mustRead(t, res.Chart)) {
		t.Errorf("the pulled chart is not %s", res.Chart)
	}
	ch, err := loader.LoadArchive(bytes.NewReader(pulled.Chart.Data))
	if err != nil {
		t.Fatal(err)
	}
	if ch.Metadata.Version != "0.3.0-rc.1" || ch.Metadata.AppVersion != testVersion {
		t.Errorf("chart version %s appVersion %s, want 0.3.0-rc.1 and %s", ch.Metadata.Version, ch.Metadata.AppVersion, testVersion)
	}
	out, err := helmchart.Render(ch, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := "image: " + host + "/kubemesh/linkerd-cni:" + testVersion; !strings.Contains(out["30-daemonset.yaml"], want) {
		t.Errorf("the chart's default rendering does not run %q:\n%s", want, out["30-daemonset.yaml"])
	}
}

// TestReleaseUnsigned: without a key a release pushes everything but signatures; without a
// registry it only writes the release directory. These are the two ways docs/install.md installs
// from a checkout (make release REGISTRY=..., make images and an import on each node): its
// command blocks run against these releases and must render the images they made. The sizes
// images.md and performance.md give must be within 10% of these binaries and images.
func TestReleaseUnsigned(t *testing.T) {
	bin := buildBins(t)
	host := startRegistry(t, true)
	o := releaseOptions(t, bin, host+"/kubemesh")
	res, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.PublicKey != "" {
		t.Errorf("an unsigned release wrote %s", res.PublicKey)
	}
	_, pub := writeKey(t, "")
	v, err := LoadVerifier(pub)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range res.Images {
		d, _ := name.NewDigest(strings.Split(r.Ref, ":")[0] + ":" + strings.Split(r.Ref, ":")[1] + "@" + r.Digest.String())
		if err := Verify(context.Background(), d, v, loopbackOnly...); !errors.Is(err, ErrNoSignature) {
			t.Errorf("%s: %v, want %v", d, err, ErrNoSignature)
		}
		if _, err := remote.Head(mustRef(t, r.Ref), loopbackOnly...); err != nil {
			t.Errorf("%s not pushed: %v", r.Ref, err)
		}
	}
	checkInstallThroughRegistry(t, res, o.Out, host)
	checkImageSizes(t, res)
	checkBinarySizes(t, bin)
	o = releaseOptions(t, bin, "")
	res, err = Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	if res.ChartRef != "" || res.Images[0].Ref != "ghcr.io/kubemesh/linkerd-cni:"+testVersion {
		t.Errorf("without a registry: chart pushed to %q, image %s", res.ChartRef, res.Images[0].Ref)
	}
	checkSumsWithout(t, o.Out, PublicKeyFile)
	checkInstallByImport(t, res)
}

// checkSumsWithout is checkSums for a release without the files named.
func checkSumsWithout(t *testing.T, dir string, absent ...string) {
	t.Helper()
	for _, f := range absent {
		if _, err := os.Stat(filepath.Join(dir, f)); !os.IsNotExist(err) {
			t.Errorf("%s: %v, want no such file", f, err)
		}
	}
	sums := string(mustRead(t, filepath.Join(dir, SumsFile)))
	for _, want := range []string{"  images/linkerd-cni.tar\n", "  images/linkerd-cni.linux-amd64.spdx.json\n", "  linkerd2-cni-0.3.0-rc.1.tgz\n", "  " + DigestsFile + "\n"} {
		if !strings.Contains(sums, want) {
			t.Errorf("SHA256SUMS lacks %q:\n%s", want, sums)
		}
	}
}

// TestReleaseRefusesBadInput: each problem is an exact error before anything is written or
// pushed.
func TestReleaseRefusesBadInput(t *testing.T) {
	host := startRegistry(t, true)
	key, _ := writeKey(t, "right")
	garbage := filepath.Join(t.TempDir(), "garbage.key")
	if err := os.WriteFile(garbage, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"no v", func(o *Options) { o.Version = "1.2.3" }, `version "1.2.3": want v and a SemVer, such as v0.2.0 or v0.2.0-rc.1`},
		{"not SemVer", func(o *Options) { o.Version = "v1.2" }, `version "v1.2": want v and a SemVer, such as v0.2.0 or v0.2.0-rc.1`},
		{"bad registry", func(o *Options) { o.Registry = "Bad Registry" }, `registry "Bad Registry": want host[:port]/namespace: repository can only contain the characters ` + "`abcdefghijklmnopqrstuvwxyz0123456789_-./`: Bad Registry/linkerd-cni"},
		{"key without registry", func(o *Options) { o.Registry, o.KeyFile = "", key }, "signing key " + key + " given without a registry: signatures are pushed beside the images (REGISTRY=host[:port]/namespace)"},
		{"wrong password", func(o *Options) { o.KeyFile, o.Password = key, []byte("wrong") }, "signing key " + key + ": encrypted: decryption failed (a cosign key needs its password in COSIGN_PASSWORD)"},
		{"not a key", func(o *Options) { o.KeyFile = garbage }, "signing key " + garbage + ": PEM decoding failed (a cosign key needs its password in COSIGN_PASSWORD)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := releaseOptions(t, t.TempDir(), host+"/kubemesh")
			tc.edit(&o)
			_, err := Run(context.Background(), o)
			if err == nil || err.Error() != tc.want {
				t.Errorf("error %v\nwant %s", err, tc.want)
			}
			if entries, _ := os.ReadDir(o.Out); len(entries) > 0 {
				t.Errorf("%s written: %v", o.Out, entries)
			}
			if c := catalog(t, host); c != `{"repositories":null}` {
				t.Errorf("pushed: %s", c)
			}
		})
	}
}

// TestLoadSigner reads cosign's encrypted keys and plain PEM keys; what one signs, its public
// key verifies.
func TestLoadSigner(t *testing.T) {
	host := startRegistry(t, false)
	img := fakeImage(t, basePlatforms[0], linkerdFiles("amd64"))
	ref := host + "/kubemesh/signed:v1"
	if err := remote.Write(mustRef(t, ref), img, loopbackOnly...); err != nil {
		t.Fatal(err)
	}
	d, _ := img.Digest()
	digest, _ := name.NewDigest(host + "/kubemesh/signed@" + d.String())
	plain, _, err := cryptoutils.GeneratePEMEncodedECDSAKeyPair(elliptic.P256(), nil)
	if err != nil {
		t.Fatal(err)
	}
	plainFile := filepath.Join(t.TempDir(), "plain.pem")
	if err := os.WriteFile(plainFile, plain, 0o600); err != nil {
		t.Fatal(err)
	}
	cosignKey, _ := writeKey(t, "pw")
	noPassword, _ := writeKey(t, "")
	for _, tc := range []struct {
		file, password string
	}{{cosignKey, "pw"}, {noPassword, ""}, {plainFile, ""}} {
		s, err := LoadSigner(tc.file, []byte(tc.password))
		if err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if _, err := s.Sign(context.Background(), digest, loopbackOnly...); err != nil {
			t.Fatal(err)
		}
		pub, _ := s.PublicKeyPEM()
		pubFile := filepath.Join(t.TempDir(), "cosign.pub")
		os.WriteFile(pubFile, pub, 0o644)
		v, err := LoadVerifier(pubFile)
		if err != nil {
			t.Fatal(err)
		}
		if err := Verify(context.Background(), digest, v, loopbackOnly...); err != nil {
			t.Errorf("%s: %v", tc.file, err)
		}
	}
}
