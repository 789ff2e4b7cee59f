package release

import (
	"archive/tar"
	"bytes"
	"context"
	"debug/elf"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kubemesh/proxy-init/tools/images"
)

// Linkerd 2.20's chart command lines that run from the proxy image (docs/linkerd-compatibility.md):
// the linkerd-init container and CNI mode's network validator.
var linkerdCommandLines = [][]string{
	{"/usr/lib/linkerd/linkerd2-proxy-init", "--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102", "--inbound-ports-to-ignore", "4190,4191,4567,4568"},
	{"/usr/lib/linkerd/linkerd2-network-validator", "--log-format", "plain", "--log-level", "debug", "--connect-addr", "1.1.1.1:20001", "--listen-addr", "0.0.0.0:4140", "--timeout", "10s"},
}

var basePlatforms = []v1.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm64", Variant: "v8"}}

var epoch = time.Unix(1700000000, 0).UTC()

// TestOverlay pushes a fake multi-arch Linkerd proxy image to a registry in the test process,
// overlays it, pulls the result and checks it layer by layer, platform by platform: the base's
// layers, configuration and annotations unchanged, one layer of ours added, the base recorded,
// and Linkerd's command lines finding our binaries, built for the platform.
func TestOverlay(t *testing.T) {
	bin := buildBins(t)
	host := startRegistry(t, false)
	base := fakeIndex(t, basePlatforms, linkerdFiles)
	baseRef := host + "/linkerd/proxy:edge-26.1.1"
	if err := remote.WriteIndex(mustRef(t, baseRef), base); err != nil {
		t.Fatal(err)
	}
	target := host + "/kubemesh/proxy:edge-26.1.1"
	res, err := Overlay(context.Background(), OverlayOptions{
		Base: baseRef, Target: target, BinDir: bin, Platforms: images.Platforms, Epoch: epoch, Version: "v0.0.0-test", Remote: loopbackOnly,
	})
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Index(mustRef(t, target))
	if err != nil {
		t.Fatal(err)
	}
	if d, _ := got.Digest(); d.String() != res.Ref.DigestStr() {
		t.Errorf("pushed %s, Overlay says %s", d, res.Ref)
	}
	checkOverlay(t, base, baseRef, got, bin)
	if len(res.Dropped) != 1 || res.Dropped[0].Annotations[dockerReferenceType] != "attestation-manifest" {
		t.Errorf("dropped %+v, want the attestation manifest", res.Dropped)
	}

	// The same base from an OCI layout, and from an OCI archive of it, gives the same images.
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendIndex(base); err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "base.tar")
	tarDir(t, dir, archive)
	for _, local := range []string{dir, archive} {
		res2, err := Overlay(context.Background(), OverlayOptions{
			Base: local, Target: host + "/kubemesh/proxy:local", BinDir: bin, Platforms: images.Platforms, Epoch: epoch, Version: "v0.0.0-test", Remote: loopbackOnly,
		})
		if err != nil {
			t.Fatalf("%s: %v", local, err)
		}
		got2, err := remote.Index(res2.Ref)
		if err != nil {
			t.Fatal(err)
		}
		checkOverlay(t, base, local, got2, bin)
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// checkOverlay compares the overlay got with its base, platform by platform.
func checkOverlay(t *testing.T, base v1.ImageIndex, baseName string, got v1.ImageIndex, bin string) {
	t.Helper()
	bm, _ := base.IndexManifest()
	gm, err := got.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	baseDigest, _ := base.Digest()
	if gm.Annotations[AnnotationBaseDigest] != baseDigest.String() || gm.Annotations[AnnotationBaseName] != baseName || gm.Annotations["org.opencontainers.image.version"] != "edge-26.1.1" {
		t.Errorf("index annotations %v: want the base's, and %s %s, %s %s", gm.Annotations, AnnotationBaseDigest, baseDigest, AnnotationBaseName, baseName)
	}
	if gm.MediaType != bm.MediaType || len(gm.Manifests) != len(basePlatforms) {
		t.Fatalf("index %s with %d entries, want %s with %d (the attestation left out)", gm.MediaType, len(gm.Manifests), bm.MediaType, len(basePlatforms))
	}
	for i, bd := range bm.Manifests[:len(basePlatforms)] {
		gd := gm.Manifests[i]
		arch := bd.Platform.Architecture
		t.Run(arch, func(t *testing.T) {
			if !gd.Platform.Equals(*bd.Platform) {
				t.Errorf("platform %+v, want the base's %+v", gd.Platform, bd.Platform)
			}
			bi, _ := base.Image(bd.Digest)
			gi, err := got.Image(gd.Digest)
			if err != nil {
				t.Fatal(err)
			}
			bman, _ := bi.Manifest()
			gman, _ := gi.Manifest()
			if gman.Annotations[AnnotationBaseDigest] != bd.Digest.String() || gman.Annotations[AnnotationBaseName] != baseName || gman.Annotations["org.opencontainers.image.title"] != bman.Annotations["org.opencontainers.image.title"] {
				t.Errorf("manifest annotations %v, want the base's and %s %s", gman.Annotations, AnnotationBaseDigest, bd.Digest)
			}
			if gman.MediaType != bman.MediaType {
				t.Errorf("manifest media type %s, want the base's %s", gman.MediaType, bman.MediaType)
			}
			// Layer by layer: the base's, then exactly one of ours.
			if len(gman.Layers) != len(bman.Layers)+1 {
				t.Fatalf("%d layers, want the base's %d and ours", len(gman.Layers), len(bman.Layers))
			}
			for j, l := range bman.Layers {
				if gman.Layers[j].Digest != l.Digest || gman.Layers[j].MediaType != l.MediaType {
					t.Errorf("layer %d is %s, want the base's %s", j, gman.Layers[j].Digest, l.Digest)
				}
			}
			plat := "linux/" + arch
			wantLayer, err := images.Layer(images.Overlay, images.Inputs{BinDir: images.PlatformBinDir(bin, plat), Epoch: epoch})
			if err != nil {
				t.Fatal(err)
			}
			layers, _ := gi.Layers()
			rc, err := layers[len(layers)-1].Uncompressed()
			if err != nil {
				t.Fatal(err)
			}
			ours, _ := io.ReadAll(rc)
			rc.Close()
			if !bytes.Equal(ours, wantLayer) {
				t.Errorf("the added layer is not images.Overlay's layer for %s", plat)
			}
			// The configuration: everything the base had, one more diff ID and history entry.
			bc, _ := bi.ConfigFile()
			gc, _ := gi.ConfigFile()
			if diff := cmp.Diff(bc.Config, gc.Config); diff != "" {
				t.Errorf("configuration (entrypoint, user, env, labels) changed (-base +got):\n%s", diff)
			}
			if gc.OS != bc.OS || gc.Architecture != bc.Architecture || gc.Variant != bc.Variant || !gc.Created.Equal(bc.Created.Time) {
				t.Errorf("config platform or creation %s/%s/%s %v, want the base's %s/%s/%s %v", gc.OS, gc.Architecture, gc.Variant, gc.Created, bc.OS, bc.Architecture, bc.Variant, bc.Created)
			}
			if !slices.Equal(gc.RootFS.DiffIDs[:len(bc.RootFS.DiffIDs)], bc.RootFS.DiffIDs) || len(gc.RootFS.DiffIDs) != len(bc.RootFS.DiffIDs)+1 {
				t.Errorf("diff IDs %v, want the base's %v and one more", gc.RootFS.DiffIDs, bc.RootFS.DiffIDs)
			}
			if len(gc.History) != len(bc.History)+1 || !strings.Contains(gc.History[len(gc.History)-1].CreatedBy, "kubemesh proxy-init v0.0.0-test overlay") {
				t.Errorf("history %+v, want the base's and ours", gc.History)
			}
			// The file system: Linkerd's command lines find our binaries, built for the
			// platform; every other file is the base's.
			gotFS, baseFS := flatten(t, gi), flatten(t, bi)
			proxyInit, err := os.ReadFile(filepath.Join(images.PlatformBinDir(bin, plat), images.BinProxyInit))
			if err != nil {
				t.Fatal(err)
			}
			for _, line := range linkerdCommandLines {
				e, ok := gotFS[line[0]]
				if !ok || e.hdr.Typeflag != tar.TypeReg || !bytes.Equal(e.data, proxyInit) {
					t.Errorf("%s (%s): not our proxy-init", line[0], strings.Join(line, " "))
					continue
				}
				f, err := elf.NewFile(bytes.NewReader(e.data))
				if err != nil || f.Machine != map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}[arch] {
					t.Errorf("%s: ELF %v (%v), want %s", line[0], f, err, arch)
				}
			}
			if _, ok := gotFS["/usr/lib/linkerd/linkerd2-proxy-init"].hdr.PAXRecords[images.XattrCaps]; !ok {
				t.Error("proxy-init lacks its file capabilities")
			}
			for p, e := range baseFS {
				if slices.Contains(LinkerdPaths, p) {
					continue
				}
				if g, ok := gotFS[p]; !ok || !bytes.Equal(g.data, e.data) || g.hdr.Typeflag != e.hdr.Typeflag {
					t.Errorf("%s: not the base's", p)
				}
			}
		})
	}
}

type fsEntry struct {
	hdr  *tar.Header
	data []byte
}

// flatten reads an image's file system, its layers applied.
func flatten(t *testing.T, img v1.Image) map[string]fsEntry {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]fsEntry{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		out[path.Clean("/"+h.Name)] = fsEntry{h, data}
	}
}

// tarDir writes dir's files into an archive, as `make images` lays one out.
func tarDir(t *testing.T, dir, archive string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || fi.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: rel, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	tw.Close()
	if err := os.WriteFile(archive, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestOverlayRefusesBadBases: a base that does not exist, one without Linkerd's paths (a 2.19
// proxy image), one of a platform we do not build, and binaries missing for a platform: each an
// exact error, and nothing pushed.
func TestOverlayRefusesBadBases(t *testing.T) {
	bin := buildBins(t)
	host := startRegistry(t, false)
	push := func(ref string, idx v1.ImageIndex) {
		if err := remote.WriteIndex(mustRef(t, ref), idx); err != nil {
			t.Fatal(err)
		}
	}
	old := func(arch string) []file { return []file{{name: "usr/lib/linkerd/linkerd2-proxy", data: "2.19 proxy"}} }
	push(host+"/linkerd/proxy:2.19", fakeIndex(t, basePlatforms, old))
	s390x := append(slices.Clone(basePlatforms), v1.Platform{OS: "linux", Architecture: "s390x"})
	push(host+"/linkerd/proxy:s390x", fakeIndex(t, s390x, linkerdFiles))
	push(host+"/linkerd/proxy:ok", fakeIndex(t, basePlatforms, linkerdFiles))
	noEntrypoint := func(arch string) []file { return linkerdFiles(arch)[1:] }
	push(host+"/linkerd/proxy:noproxy", fakeIndex(t, basePlatforms[:1], noEntrypoint))
	reposBefore := catalog(t, host)
	onlyAMD64 := t.TempDir()
	if err := os.Symlink(images.PlatformBinDir(bin, "linux/amd64"), images.PlatformBinDir(onlyAMD64, "linux/amd64")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		base, bin, want string
	}{
		{host + "/linkerd/proxy:nope", bin, "base " + host + "/linkerd/proxy:nope: GET http://" + host + "/v2/linkerd/proxy/manifests/nope: MANIFEST_UNKNOWN: Unknown manifest"},
		{"/nonexistent/proxy.tar", bin, "base /nonexistent/proxy.tar: stat /nonexistent/proxy.tar: no such file or directory"},
		{"Linkerd/Proxy", bin, `base "Linkerd/Proxy" is neither a file nor a registry reference: could not parse reference: Linkerd/Proxy`},
		{host + "/linkerd/proxy:2.19", bin, "base " + host + "/linkerd/proxy:2.19: linux/amd64 lacks /usr/lib/linkerd/linkerd2-proxy-init, /usr/lib/linkerd/linkerd2-network-validator, which Linkerd 2.20's chart runs: is it Linkerd's proxy image, 2.20 or later?; linux/arm64 lacks /usr/lib/linkerd/linkerd2-proxy-init, /usr/lib/linkerd/linkerd2-network-validator, which Linkerd 2.20's chart runs: is it Linkerd's proxy image, 2.20 or later?; nothing pushed"},
		{host + "/linkerd/proxy:noproxy", bin, "base " + host + "/linkerd/proxy:noproxy: linux/amd64 lacks /usr/lib/linkerd/linkerd2-proxy, which Linkerd 2.20's chart runs: is it Linkerd's proxy image, 2.20 or later?; nothing pushed"},
		{host + "/linkerd/proxy:s390x", bin, "base " + host + "/linkerd/proxy:s390x: platform linux/s390x is not one we build (linux/amd64, linux/arm64); nothing pushed"},
		{host + "/linkerd/proxy:ok", onlyAMD64, "base " + host + "/linkerd/proxy:ok: linux/arm64: read the architecture of " + filepath.Join(onlyAMD64, "linux-arm64", "proxy-init") + ": open " + filepath.Join(onlyAMD64, "linux-arm64", "proxy-init") + ": no such file or directory (make platform-bins); nothing pushed"},
	}
	for _, tc := range tests {
		target := host + "/kubemesh/proxy:bad"
		_, err := Overlay(context.Background(), OverlayOptions{Base: tc.base, Target: target, BinDir: tc.bin, Platforms: images.Platforms, Epoch: epoch, Remote: loopbackOnly})
		if err == nil || err.Error() != tc.want {
			t.Errorf("base %s:\n got %v\nwant %s", tc.base, err, tc.want)
		}
		if _, err := remote.Head(mustRef(t, target)); !isNotFound(err) {
			t.Errorf("base %s: %s was pushed (%v)", tc.base, target, err)
		}
		if after := catalog(t, host); after != reposBefore {
			t.Errorf("base %s: the registry's repositories went from %s to %s", tc.base, reposBefore, after)
		}
	}
}
