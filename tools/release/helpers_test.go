package release

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubemesh/proxy-init/tools/images"
)

const repoRoot = "../.."

// startRegistry serves go-containerregistry's registry on loopback, in the test process, with
// or without the referrers API, and returns its host:port.
func startRegistry(t *testing.T, referrers bool) string {
	t.Helper()
	s := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0)), registry.WithReferrersSupport(referrers)))
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://")
}

// loopbackOnly makes go-containerregistry dial nothing but loopback: a test that got a reference
// wrong fails instead of reaching a registry outside the machine.
var loopbackOnly = []remote.Option{remote.WithTransport(&http.Transport{
	DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		host, _, err := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			return nil, fmt.Errorf("test dials only loopback, not %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	},
})}

// catalog lists the registry's repositories.
func catalog(t *testing.T, host string) string {
	t.Helper()
	resp, err := http.Get("http://" + host + "/v2/_catalog")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b))
}

// bins holds our binaries for every platform, built once with the Makefile's build lines.
var bins struct {
	once sync.Once
	dir  string
	err  error
}

func buildBins(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping in -short mode: cross-compiles the binaries")
	}
	bins.once.Do(func() {
		if bins.dir, bins.err = os.MkdirTemp("", "release-test-"); bins.err != nil {
			return
		}
		cmd := exec.Command("make", "--no-print-directory", "platform-bins", "BIN="+bins.dir, "VERSION=v0.0.0-test", "PLATFORMS="+strings.Join(images.Platforms, " "))
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			bins.err = fmt.Errorf("make platform-bins: %v\n%s", err, out)
		}
	})
	if bins.err != nil {
		t.Fatal(bins.err)
	}
	return bins.dir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bins.dir != "" {
		os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

// file is one entry of a fake layer: a regular file unless link is set.
type file struct{ name, data, link string }

// fakeLayer is a gzip layer of files, with their parent directories.
func fakeLayer(t *testing.T, files ...file) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		for d := filepath.Dir(f.name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
				t.Fatal(err)
			}
		}
		h := &tar.Header{Name: f.name, Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(f.data))}
		if f.link != "" {
			h = &tar.Header{Name: f.name, Typeflag: tar.TypeSymlink, Linkname: f.link, Mode: 0o777}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(f.data)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	raw := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil }, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// linkerdFiles are a fake Linkerd 2.20 proxy image's files for arch.
func linkerdFiles(arch string) []file {
	return []file{
		{name: "usr/lib/linkerd/linkerd2-proxy", data: "linkerd2-proxy for " + arch},
		{name: "usr/lib/linkerd/linkerd2-proxy-init", data: "Linkerd's proxy-init for " + arch},
		{name: "usr/lib/linkerd/linkerd2-network-validator", data: "Linkerd's validator for " + arch},
		{name: "usr/lib/linkerd/linkerd-await", data: "linkerd-await"},
		{name: "etc/passwd", data: "root:x:0:0::/:/sbin/nologin\n"},
	}
}

// fakeImage is one platform of a fake proxy image: a layer of files, a second layer, and
// Linkerd's entrypoint, user, environment and labels.
func fakeImage(t *testing.T, p v1.Platform, files []file) v1.Image {
	t.Helper()
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base,
		mutate.Addendum{Layer: fakeLayer(t, files...), History: v1.History{CreatedBy: "COPY proxy"}},
		mutate.Addendum{Layer: fakeLayer(t, file{name: "usr/share/linkerd/notice", data: "second layer"}), History: v1.History{CreatedBy: "COPY notice"}},
	)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Config.Entrypoint = []string{"/usr/lib/linkerd/linkerd2-proxy"}
	cf.Config.User = "2102"
	cf.Config.Env = []string{"PATH=/usr/lib/linkerd", "LINKERD2_PROXY_LOG=warn"}
	cf.Config.Labels = map[string]string{"org.opencontainers.image.source": "https://example.invalid/linkerd2-proxy"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return mutate.Annotations(img, map[string]string{"org.opencontainers.image.title": "proxy " + p.Architecture}).(v1.Image)
}

// fakeIndex is a fake multi-arch proxy image: one image per platform, and a BuildKit-style
// attestation manifest.
func fakeIndex(t *testing.T, platforms []v1.Platform, files func(arch string) []file) v1.ImageIndex {
	t.Helper()
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		p := p
		adds = append(adds, mutate.IndexAddendum{Add: fakeImage(t, p, files(p.Architecture)), Descriptor: v1.Descriptor{Platform: &p}})
	}
	att, err := mutate.Append(mutate.MediaType(empty.Image, types.OCIManifestSchema1), mutate.Addendum{Layer: fakeLayer(t, file{name: "provenance.json", data: "{}"})})
	if err != nil {
		t.Fatal(err)
	}
	adds = append(adds, mutate.IndexAddendum{Add: att, Descriptor: v1.Descriptor{
		Platform:    &v1.Platform{OS: "unknown", Architecture: "unknown"},
		Annotations: map[string]string{dockerReferenceType: "attestation-manifest"},
	}})
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	return mutate.Annotations(idx, map[string]string{"org.opencontainers.image.version": "edge-26.1.1"}).(v1.ImageIndex)
}
