package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"
)

// Find returns the image named name among Images and Overlay.
func Find(name string) (Image, error) {
	all := append(slices.Clone(Images), Overlay)
	if i := slices.IndexFunc(all, func(img Image) bool { return img.Name == name }); i >= 0 {
		return all[i], nil
	}
	var names []string
	for _, img := range Images {
		names = append(names, img.Name)
	}
	return Image{}, fmt.Errorf("unknown image %q; want one of %s", name, strings.Join(names, ", "))
}

// Platforms are the platforms `make images` and `make release` build every image for, and the
// overlay's (Linkerd ships its proxy image for these two).
var Platforms = []string{"linux/amd64", "linux/arm64"}

// PlatformBinDir is where the binaries for platform are under the build output directory bin
// (`make platform-bins`): bin/linux-arm64 for linux/arm64.
func PlatformBinDir(bin, platform string) string {
	return filepath.Join(bin, strings.ReplaceAll(platform, "/", "-"))
}

// PlatformImage is one platform's image of a build.
type PlatformImage struct {
	Platform v1.Platform
	Image    v1.Image
	// BinDir holds the binaries it was built from; Debian, its Debian packages.
	BinDir string
	Debian []DebPackage
}

// Built is one image for every platform: the index, and its images in the index's order.
type Built struct {
	Image     Image
	Tag       string
	Index     v1.ImageIndex
	Platforms []PlatformImage
}

// layerFor builds img's layer for the architecture of in.BinDir's binaries, with its Debian
// packages (FetchDebs returns them in img.Debian's order).
func layerFor(img Image, in Inputs) (layer []byte, goarch string, debs []DebPackage, err error) {
	goarch, err = GoArch(filepath.Join(in.BinDir, BinProxyInit))
	if err != nil {
		return nil, "", nil, err
	}
	if len(img.Debian) > 0 {
		if debs, err = FetchDebs(in.DebCache, goarch, img.Debian); err != nil {
			return nil, "", nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		in.Debs = debs
	}
	layer, err = Layer(img, in)
	return layer, goarch, debs, err
}

// Build builds img, tagged tag, for every platform, each from its binaries in
// PlatformBinDir(in.BinDir, platform), as one OCI image index.
func Build(img Image, tag string, platforms []string, in Inputs) (*Built, error) {
	if len(platforms) == 0 {
		return nil, fmt.Errorf("image %s: no platform to build", img.Name)
	}
	b := &Built{Image: img, Tag: tag}
	var adds []mutate.IndexAddendum
	for _, p := range platforms {
		want, err := v1.ParsePlatform(p)
		if err != nil || want.OS != "linux" || want.Variant != "" {
			return nil, fmt.Errorf("platform %q: want linux/ARCH, such as linux/arm64", p)
		}
		pin := in
		pin.BinDir = PlatformBinDir(in.BinDir, p)
		layer, goarch, debs, err := layerFor(img, pin)
		if err != nil {
			return nil, err
		}
		if goarch != want.Architecture {
			return nil, fmt.Errorf("image %s: the binaries in %s are for %s, want %s (make platform-bins)", img.Name, pin.BinDir, goarch, want.Architecture)
		}
		var labels map[string]string
		if len(debs) > 0 {
			var versions []string
			for _, d := range debs {
				versions = append(versions, d.Name+"="+d.Version)
			}
			labels = map[string]string{LabelDebian: strings.Join(versions, " ")}
		}
		im, err := OCIImage(img, layer, goarch, labels, in)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
		pi := PlatformImage{Platform: v1.Platform{OS: "linux", Architecture: goarch}, Image: im, BinDir: pin.BinDir, Debian: debs}
		b.Platforms = append(b.Platforms, pi)
		adds = append(adds, mutate.IndexAddendum{Add: pi.Image, Descriptor: v1.Descriptor{Platform: &pi.Platform}})
	}
	idx := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, types.OCIImageIndex), adds...)
	b.Index = mutate.Annotations(idx, map[string]string{AnnotationVersion: tag}).(v1.ImageIndex)
	return b, nil
}

// BuildOCI builds img, tagged tag, for every platform and writes it as an OCI image archive at
// dst.
func BuildOCI(dst string, img Image, tag string, platforms []string, in Inputs) (*Built, error) {
	b, err := Build(img, tag, platforms, in)
	if err != nil {
		return nil, err
	}
	if err := WriteOCIArchive(dst, b.Index, img.Ref(tag), in); err != nil {
		return nil, fmt.Errorf("image %s: %w", img.Name, err)
	}
	return b, nil
}

// WriteRootFS unpacks img's layer into the directory dst (created, must not exist), file
// capabilities included: the Dockerfiles' way to the same file system, which they then COPY
// whole into a scratch image. Setting capabilities needs CAP_SETFCAP.
func WriteRootFS(dst string, img Image, in Inputs) error {
	layer, _, _, err := layerFor(img, in)
	if err != nil {
		return err
	}
	return Unpack(dst, layer)
}

// Unpack writes the entries of a layer (or of an OCI archive) under dst, as a container runtime
// would: modes, links, and the security.capability xattr. No entry leaves dst (os.Root),
// whatever its name or the links before it say.
func Unpack(dst string, layer []byte) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	entries, err := readLayer(bytes.NewReader(layer))
	if err != nil {
		return err
	}
	for _, e := range entries {
		name, mode := e.hdr.Name, os.FileMode(e.hdr.Mode&0o777)
		switch e.hdr.Typeflag {
		case tar.TypeDir:
			err = root.MkdirAll(name, 0o755)
		case tar.TypeSymlink:
			err = root.Symlink(e.hdr.Linkname, name)
		case tar.TypeLink:
			err = root.Link(e.hdr.Linkname, name)
		case tar.TypeReg:
			if err = root.MkdirAll(filepath.Dir(name), 0o755); err == nil {
				err = root.WriteFile(name, e.data, mode)
			}
		default:
			err = fmt.Errorf("%s: unsupported entry type %q", name, e.hdr.Typeflag)
		}
		if err != nil {
			return err
		}
		if e.hdr.Typeflag == tar.TypeSymlink || e.hdr.Typeflag == tar.TypeLink {
			continue
		}
		// Chmod after WriteFile (umask) and for the sticky bit, then the xattr, last: a write or
		// a chown would clear it.
		if e.hdr.Mode&0o1000 != 0 {
			mode |= os.ModeSticky
		}
		if err := root.Chmod(name, mode); err != nil {
			return err
		}
		if x, ok := e.hdr.PAXRecords[XattrCaps]; ok {
			if err := setCaps(root, name, x); err != nil {
				return fmt.Errorf("%s: set file capabilities: %w", name, err)
			}
		}
	}
	return nil
}

// setCaps sets the security.capability xattr of the file name under root.
func setCaps(root *os.Root, name, x string) error {
	f, err := root.Open(name)
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.Fsetxattr(int(f.Fd()), "security.capability", []byte(x), 0)
}
