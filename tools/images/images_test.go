package images

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

var update = flag.Bool("update", false, "rewrite the generated Dockerfiles in deploy/docker")

const repoRoot = "../.."

// TestDockerfilesUpToDate holds deploy/docker to the layout: every Dockerfile there is the one
// Dockerfile renders (go test -update rewrites them; so does `make dockerfiles`).
func TestDockerfilesUpToDate(t *testing.T) {
	dir := filepath.Join(repoRoot, "deploy", "docker")
	want := map[string]string{}
	for _, img := range append(append([]Image{}, Images...), Overlay) {
		want[img.Name+".Dockerfile"] = Dockerfile(img)
	}
	if *update {
		for name, text := range want {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	have, err := filepath.Glob(filepath.Join(dir, "*Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range have {
		name := filepath.Base(p)
		text, ok := want[name]
		if !ok {
			t.Errorf("%s is not generated from the layout: remove it or describe its image in layout.go", p)
			continue
		}
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != text {
			t.Errorf("%s is stale: run `make dockerfiles` (or cd tools && go test ./images -run Dockerfiles -update)", p)
		}
		delete(want, name)
	}
	for name := range want {
		t.Errorf("deploy/docker/%s is missing: run `make dockerfiles`", name)
	}
}

// TestCapXattr compares CapXattr with what setcap itself writes on a real file.
func TestCapXattr(t *testing.T) {
	for _, caps := range []string{NetCaps, "cap_net_admin,cap_net_raw+ep", "cap_net_bind_service+p"} {
		t.Run(caps, func(t *testing.T) {
			nt.RequireRoot(t) // setcap writes security.capability
			f := filepath.Join(t.TempDir(), "bin")
			if err := os.WriteFile(f, []byte("x"), 0o755); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("setcap", strings.Replace(caps, "+", "=", 1), f).CombinedOutput(); err != nil {
				t.Fatalf("setcap: %v\n%s", err, out)
			}
			want := make([]byte, 64)
			n, err := unix.Getxattr(f, "security.capability", want)
			if err != nil {
				t.Fatal(err)
			}
			got, err := CapXattr(caps)
			if err != nil || !bytes.Equal(got, want[:n]) {
				t.Fatalf("CapXattr(%q) = %x, %v; setcap wrote %x", caps, got, err, want[:n])
			}
		})
	}
	for in, wantErr := range map[string]string{
		"cap_net_admin":         `capabilities "cap_net_admin": want names+flags, such as cap_net_admin,cap_net_raw+ep`,
		"cap_sys_admin+ep":      `capabilities "cap_sys_admin+ep": unknown capability "cap_sys_admin"`,
		"cap_net_admin+ex":      `capabilities "cap_net_admin+ex": unknown flag 'x'; want e, p or i`,
		"+ep":                   `capabilities "+ep": want names+flags, such as cap_net_admin,cap_net_raw+ep`,
		"cap_net_raw,cap_x+eip": `capabilities "cap_net_raw,cap_x+eip": unknown capability "cap_x"`,
	} {
		if _, err := CapXattr(in); err == nil || err.Error() != wantErr {
			t.Errorf("CapXattr(%q) error %v, want %q", in, err, wantErr)
		}
	}
}

// TestLayerRefusesBadLayouts: a layout error names the image and the path.
func TestLayerRefusesBadLayouts(t *testing.T) {
	in := Inputs{BinDir: t.TempDir(), RepoDir: repoRoot}
	tests := []struct {
		file File
		want string
	}{
		{File{Path: "relative", Link: "x"}, "image bad: relative: not an absolute path"},
		{File{Path: "/x"}, "image bad: /x: no source: set one of Bin, Repo, Link, Dir or Debian"},
		{File{Path: "/x", Link: "y", Caps: NetCaps}, `image bad: /x: capabilities "cap_net_admin,cap_net_raw+eip" on a file that is not regular`},
		{File{Path: "/usr/sbin/xtables-nft-multi", Debian: true}, "image bad: /usr/sbin/xtables-nft-multi: not a regular file of the image's Debian packages"},
		{File{Path: "/x", Bin: "missing"}, "image bad: /x: open " + filepath.Join(in.BinDir, "missing") + ": no such file or directory"},
	}
	for _, tc := range tests {
		_, err := Layer(Image{Name: "bad", Files: []File{tc.file}}, in)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%+v: error %v, want %q", tc.file, err, tc.want)
		}
	}
}

// built holds the binaries and images TestImages and the root tests share.
var built struct {
	once sync.Once
	bin  string // BinDir: PlatformBinDir of each platform below it
	out  string // the OCI archives
	err  error
}

const testTag = "test"

// buildAll cross-compiles the binaries with the Makefile's own build lines (make platform-bins)
// and builds every image for every platform as `make images` does, once.
func buildAll(t *testing.T) (binDir, outDir string) {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping in -short mode: builds the binaries and downloads Debian packages")
	}
	built.once.Do(func() {
		dir, err := os.MkdirTemp("", "images-test-")
		if err != nil {
			built.err = err
			return
		}
		built.bin, built.out = filepath.Join(dir, "bin"), filepath.Join(dir, "images")
		cmd := exec.Command("make", "--no-print-directory", "platform-bins", "BIN="+built.bin, "VERSION=test", "PLATFORMS="+strings.Join(Platforms, " "))
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			built.err = fmt.Errorf("make platform-bins: %v\n%s", err, out)
			return
		}
		if err := os.Mkdir(built.out, 0o755); err != nil {
			built.err = err
			return
		}
		in := Inputs{BinDir: built.bin, RepoDir: repoRoot, DebCache: os.Getenv("DEB_CACHE"), Epoch: time.Unix(1700000000, 0).UTC()}
		for _, img := range Images {
			if _, err := BuildOCI(filepath.Join(built.out, img.Name+".tar"), img, testTag, Platforms, in); err != nil {
				built.err = err
				return
			}
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.bin, built.out
}

func TestMain(m *testing.M) {
	code := m.Run()
	if built.bin != "" {
		os.RemoveAll(filepath.Dir(built.bin))
	}
	os.Exit(code)
}

// ociArchive is an image archive read back with nothing but archive/tar and encoding/json, as
// an importer sees it: the layout's index.json names one image index, which holds one image per
// platform.
type ociArchive struct {
	files     map[string][]byte
	index     v1.IndexManifest // index.json
	images    v1.IndexManifest // the image index it names
	platforms []*ociImage      // in the order of images.Manifests
}

// ociImage is one platform's image of an archive.
type ociImage struct {
	manifest v1.Manifest
	config   v1.ConfigFile
	layer    []*entry
	raw      []byte // the uncompressed layer
}

// platform returns the image of arch.
func (a *ociArchive) platform(t *testing.T, arch string) *ociImage {
	t.Helper()
	for i, d := range a.images.Manifests {
		if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == arch {
			return a.platforms[i]
		}
	}
	t.Fatalf("no linux/%s image in the index %+v", arch, a.images.Manifests)
	return nil
}

func readArchive(t *testing.T, p string) *ociArchive {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	a := &ociArchive{files: map[string][]byte{}}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			a.files[h.Name] = b
		}
	}
	var ociLayout struct{ ImageLayoutVersion string }
	if mustJSON(t, a.files["oci-layout"], &ociLayout); ociLayout.ImageLayoutVersion != "1.0.0" {
		t.Fatalf("%s: oci-layout %q", p, a.files["oci-layout"])
	}
	// Every blob is named by its digest.
	for name, b := range a.files {
		if d, ok := strings.CutPrefix(name, "blobs/sha256/"); ok {
			if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != d {
				t.Errorf("%s: blob %s has digest %x", p, name, sum)
			}
		}
	}
	blob := func(h v1.Hash) []byte {
		b, ok := a.files["blobs/sha256/"+h.Hex]
		if !ok {
			t.Fatalf("%s: blob %s missing", p, h)
		}
		return b
	}
	mustJSON(t, a.files["index.json"], &a.index)
	if len(a.index.Manifests) != 1 || a.index.Manifests[0].MediaType != "application/vnd.oci.image.index.v1+json" {
		t.Fatalf("%s: index.json %+v, want one OCI image index", p, a.index.Manifests)
	}
	mustJSON(t, blob(a.index.Manifests[0].Digest), &a.images)
	for _, d := range a.images.Manifests {
		im := &ociImage{}
		mustJSON(t, blob(d.Digest), &im.manifest)
		mustJSON(t, blob(im.manifest.Config.Digest), &im.config)
		if len(im.manifest.Layers) != 1 || len(im.config.RootFS.DiffIDs) != 1 {
			t.Fatalf("%s: %d layers, %d diff IDs; want 1", p, len(im.manifest.Layers), len(im.config.RootFS.DiffIDs))
		}
		zr, err := gzip.NewReader(bytes.NewReader(blob(im.manifest.Layers[0].Digest)))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(raw); hex.EncodeToString(sum[:]) != im.config.RootFS.DiffIDs[0].Hex {
			t.Errorf("%s: the layer's diff ID is not its uncompressed digest", p)
		}
		im.raw = raw
		if im.layer, err = readLayer(bytes.NewReader(raw)); err != nil {
			t.Fatal(err)
		}
		a.platforms = append(a.platforms, im)
	}
	return a
}

func mustJSON(t *testing.T, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
}

// TestImages opens every archive `make images` writes and checks it against the layout: the
// index names the image for ctr and holds one image per platform; each configuration carries
// OS, architecture, entrypoint, command and user, and each layer holds every path with its
// content, mode, link and capabilities, its ELF programs built for the platform (ours static).
func TestImages(t *testing.T) {
	binDir, outDir := buildAll(t)
	for _, img := range Images {
		t.Run(img.Name, func(t *testing.T) {
			a := readArchive(t, filepath.Join(outDir, img.Name+".tar"))
			d := a.index.Manifests[0]
			if d.Annotations[AnnotationImageName] != img.Ref(testTag) || d.Annotations[AnnotationRefName] != testTag+img.TagSuffix {
				t.Errorf("index annotations %v, want %s", d.Annotations, img.Ref(testTag))
			}
			if v := a.images.Annotations[AnnotationVersion]; v != testTag {
				t.Errorf("image index annotation %s = %q, want %q", AnnotationVersion, v, testTag)
			}
			if len(a.images.Manifests) != len(Platforms) {
				t.Fatalf("%d images in the index, want one per platform of %v", len(a.images.Manifests), Platforms)
			}
			for i, p := range Platforms {
				arch := p[strings.Index(p, "/")+1:]
				t.Run(arch, func(t *testing.T) {
					if got := a.images.Manifests[i].Platform; got == nil || got.OS != "linux" || got.Architecture != arch {
						t.Errorf("index entry %d platform %+v, want linux/%s", i, got, arch)
					}
					im := a.platform(t, arch)
					c := im.config
					if c.OS != "linux" || c.Architecture != arch {
						t.Errorf("config platform %s/%s, want linux/%s", c.OS, c.Architecture, arch)
					}
					if !slices.Equal(c.Config.Entrypoint, img.Entrypoint) || !slices.Equal(c.Config.Cmd, img.Cmd) || c.Config.User != img.User {
						t.Errorf("config entrypoint %q cmd %q user %q; want %q %q %q", c.Config.Entrypoint, c.Config.Cmd, c.Config.User, img.Entrypoint, img.Cmd, img.User)
					}
					for _, pkg := range img.Debian {
						if !strings.Contains(" "+c.Config.Labels[LabelDebian], " "+pkg+"=") {
							t.Errorf("label %s = %q lacks %s", LabelDebian, c.Config.Labels[LabelDebian], pkg)
						}
					}
					checkLayer(t, img, im.layer, PlatformBinDir(binDir, p))
					checkELF(t, img, im.layer, arch)
				})
			}
		})
	}
}

// elfMachines are the ELF machines of the platforms' architectures.
var elfMachines = map[string]elf.Machine{"amd64": elf.EM_X86_64, "arm64": elf.EM_AARCH64}

// checkELF reads the ELF header of every program in the layer: each is built for arch, and ours
// (the layout's Bin files) are static: no interpreter, no shared library.
func checkELF(t *testing.T, img Image, layer []*entry, arch string) {
	t.Helper()
	ours := map[string]bool{}
	for _, f := range img.Files {
		if f.Bin != "" {
			ours[strings.TrimPrefix(f.Path, "/")] = true
		}
	}
	programs := 0
	for _, e := range layer {
		if e.hdr.Typeflag != tar.TypeReg || !bytes.HasPrefix(e.data, []byte(elf.ELFMAG)) {
			continue
		}
		f, err := elf.NewFile(bytes.NewReader(e.data))
		if err != nil {
			t.Errorf("%s: %v", e.hdr.Name, err)
			continue
		}
		if f.Machine != elfMachines[arch] {
			t.Errorf("%s: ELF machine %v, want %v (%s)", e.hdr.Name, f.Machine, elfMachines[arch], arch)
		}
		if !ours[e.hdr.Name] {
			continue
		}
		programs++
		libs, err := f.ImportedLibraries()
		if err != nil {
			t.Errorf("%s: %v", e.hdr.Name, err)
		}
		for _, p := range f.Progs {
			if p.Type == elf.PT_INTERP || p.Type == elf.PT_DYNAMIC {
				t.Errorf("%s: has a %v program header, want a static binary", e.hdr.Name, p.Type)
			}
		}
		if len(libs) > 0 {
			t.Errorf("%s: links %v, want a static binary", e.hdr.Name, libs)
		}
	}
	if programs != len(ours) {
		t.Errorf("%d of our %d programs found in the layer", programs, len(ours))
	}
}

// TestOverlayLayer checks the layer the proxy-image overlay's Dockerfile copies over Linkerd's
// image: the two binaries under Linkerd's paths, proxy-init with Linkerd's capabilities, and
// nothing of a scratch image's base files (they would replace the proxy image's).
func TestOverlayLayer(t *testing.T) {
	binDir, _ := buildAll(t)
	binDir = PlatformBinDir(binDir, "linux/"+runtime.GOARCH)
	layer, err := Layer(Overlay, Inputs{BinDir: binDir, RepoDir: repoRoot})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := readLayer(bytes.NewReader(layer))
	if err != nil {
		t.Fatal(err)
	}
	checkLayer(t, Overlay, entries, binDir)
	for _, e := range entries {
		if e.hdr.Typeflag != tar.TypeDir && !strings.HasPrefix(e.hdr.Name, "usr/lib/linkerd/") {
			t.Errorf("the overlay holds %s", e.hdr.Name)
		}
	}
}

// checkLayer compares a layer's entries with the image's layout.
func checkLayer(t *testing.T, img Image, layer []*entry, binDir string) {
	t.Helper()
	byName := map[string]*entry{}
	for _, e := range layer {
		if e.hdr.Uid != 0 || e.hdr.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", e.hdr.Name, e.hdr.Uid, e.hdr.Gid)
		}
		if dir := path.Dir(e.hdr.Name); dir != "." {
			if p, ok := byName[dir]; !ok || p.hdr.Typeflag != tar.TypeDir {
				t.Errorf("%s comes before its directory %s", e.hdr.Name, dir)
			}
		}
		byName[e.hdr.Name] = e
	}
	files := img.Files
	if !img.OverBase {
		files = append(append([]File{}, baseFiles...), files...)
	}
	for _, f := range files {
		name := strings.TrimPrefix(f.Path, "/")
		e, ok := byName[name]
		if !ok {
			t.Errorf("%s: missing", f.Path)
			continue
		}
		h := e.hdr
		switch {
		case f.Link != "":
			if h.Typeflag != tar.TypeSymlink || h.Linkname != f.Link {
				t.Errorf("%s: type %q link %q, want a link to %s", f.Path, h.Typeflag, h.Linkname, f.Link)
			}
		case f.Dir:
			if h.Typeflag != tar.TypeDir {
				t.Errorf("%s: type %q, want a directory", f.Path, h.Typeflag)
			}
		default:
			if h.Typeflag != tar.TypeReg {
				t.Errorf("%s: type %q, want a regular file", f.Path, h.Typeflag)
			}
		}
		if f.Bin != "" {
			want, err := os.ReadFile(filepath.Join(binDir, f.Bin))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(e.data, want) {
				t.Errorf("%s: not the built %s", f.Path, f.Bin)
			}
		}
		wantMode := int64(0o755)
		switch {
		case f.Mode != 0:
			wantMode = tarMode(f.Mode)
		case f.Link != "":
			wantMode = 0o777
		case f.Repo != "":
			wantMode = 0o644
		}
		if !f.Debian && h.Mode != wantMode {
			t.Errorf("%s: mode %o, want %o", f.Path, h.Mode, wantMode)
		}
		x, has := h.PAXRecords[XattrCaps]
		switch {
		case f.Caps == "" && has:
			t.Errorf("%s: has file capabilities %x, want none", f.Path, x)
		case f.Caps != "":
			want, _ := CapXattr(f.Caps)
			if x != string(want) {
				t.Errorf("%s: file capabilities %x, want %s (%x)", f.Path, x, f.Caps, want)
			}
		}
	}
	// No other file has capabilities.
	for _, e := range layer {
		if _, has := e.hdr.PAXRecords[XattrCaps]; has && !slices.ContainsFunc(img.Files, func(f File) bool { return f.Caps != "" && f.Path == "/"+e.hdr.Name }) {
			t.Errorf("%s: file capabilities the layout does not give", e.hdr.Name)
		}
	}
}

// TestBuildRefusesBadPlatforms: a platform we cannot build, or binaries of another
// architecture, is an error naming it, and no archive is written.
func TestBuildRefusesBadPlatforms(t *testing.T) {
	binDir, _ := buildAll(t)
	img, _ := Find("proxy-init-nftables")
	in := Inputs{BinDir: binDir, RepoDir: repoRoot}
	wrong := t.TempDir()
	if err := os.Symlink(PlatformBinDir(binDir, "linux/amd64"), PlatformBinDir(wrong, "linux/arm64")); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		platforms []string
		bin       string
		want      string
	}{
		{[]string{"windows/amd64"}, binDir, `platform "windows/amd64": want linux/ARCH, such as linux/arm64`},
		{[]string{"linux/arm/v7"}, binDir, `platform "linux/arm/v7": want linux/ARCH, such as linux/arm64`},
		{[]string{"linux/s390x"}, binDir, "read the architecture of " + filepath.Join(binDir, "linux-s390x", BinProxyInit) + ": open " + filepath.Join(binDir, "linux-s390x", BinProxyInit) + ": no such file or directory"},
		{[]string{"linux/arm64"}, wrong, "image proxy-init-nftables: the binaries in " + filepath.Join(wrong, "linux-arm64") + " are for amd64, want arm64 (make platform-bins)"},
		{nil, binDir, "image proxy-init-nftables: no platform to build"},
	}
	for _, tc := range tests {
		dst := filepath.Join(t.TempDir(), "out.tar")
		in.BinDir = tc.bin
		_, err := BuildOCI(dst, img, testTag, tc.platforms, in)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v: error %v, want %q", tc.platforms, err, tc.want)
		}
		if _, err := os.Stat(dst); !os.IsNotExist(err) {
			t.Errorf("%v: %s written", tc.platforms, dst)
		}
	}
}

// TestFetchDebsLeavesTheMachineAlone fetches the arm64 packages (a foreign architecture here)
// through the private apt directory: the machine's apt lists, sources and dpkg status are
// untouched, and a second fetch downloads nothing.
func TestFetchDebsLeavesTheMachineAlone(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: downloads Debian packages")
	}
	nt.RequireRoot(t) // the shared cache is root's
	img, _ := Find("proxy-init")
	machine := func() string {
		var b strings.Builder
		for _, root := range []string{"/etc/apt", "/var/lib/apt/lists", "/var/lib/dpkg/status", "/var/lib/dpkg/arch", "/var/cache/apt"} {
			filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
				if err == nil {
					fmt.Fprintf(&b, "%s %d %s\n", p, fi.Size(), fi.ModTime())
				}
				return nil
			})
		}
		return b.String()
	}
	before := machine()
	cache := os.Getenv("DEB_CACHE")
	first, err := FetchDebs(cache, "arm64", img.Debian)
	if err != nil {
		t.Fatal(err)
	}
	stamps := map[string]time.Time{}
	for _, d := range first {
		fi, err := os.Stat(d.File)
		if err != nil {
			t.Fatal(err)
		}
		stamps[d.File] = fi.ModTime()
		if d.Arch != "arm64" && d.Arch != "all" {
			t.Errorf("%s: architecture %s, want arm64", d.File, d.Arch)
		}
	}
	second, err := FetchDebs(cache, "arm64", img.Debian)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(first, second) {
		t.Errorf("second fetch %v, first %v", second, first)
	}
	for _, d := range second {
		if fi, err := os.Stat(d.File); err != nil || !fi.ModTime().Equal(stamps[d.File]) {
			t.Errorf("%s downloaded again", d.File)
		}
	}
	if after := machine(); after != before {
		t.Errorf("the machine's apt or dpkg state changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if _, err := FetchDebs(cache, "mips", img.Debian); err == nil || err.Error() != `architecture "mips": no Debian name known` {
		t.Errorf("FetchDebs(mips): %v", err)
	}
}
