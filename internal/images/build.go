package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// Find returns the image named name among Images and Overlay.
func Find(name string) (Image, error) {
	for _, img := range append(append([]Image{}, Images...), Overlay) {
		if img.Name == name {
			return img, nil
		}
	}
	var names []string
	for _, img := range Images {
		names = append(names, img.Name)
	}
	return Image{}, fmt.Errorf("unknown image %q; want one of %s", name, strings.Join(names, ", "))
}

// layerFor builds img's layer and labels, downloading its Debian packages when in.DebDir is not
// set, for the architecture of in.BinDir's binaries.
func layerFor(img Image, in Inputs) (layer []byte, labels map[string]string, goarch string, err error) {
	goarch, err = GoArch(filepath.Join(in.BinDir, BinProxyInit))
	if err != nil {
		return nil, nil, "", err
	}
	if len(img.Debian) > 0 {
		if in.DebDir == "" {
			dir, err := tempDir("debs-")
			if err != nil {
				return nil, nil, "", err
			}
			defer os.RemoveAll(dir)
			if err := FetchDebs(dir, goarch, img.Debian); err != nil {
				return nil, nil, "", fmt.Errorf("image %s: %w", img.Name, err)
			}
			in.DebDir = dir
		}
		versions, err := DebVersions(in.DebDir, img.Debian)
		if err != nil {
			return nil, nil, "", fmt.Errorf("image %s: %w", img.Name, err)
		}
		labels = map[string]string{LabelDebian: strings.Join(versions, " ")}
	}
	layer, err = Layer(img, in)
	return layer, labels, goarch, err
}

// BuildOCI writes img, tagged tag, as an OCI image archive at dst.
func BuildOCI(dst string, img Image, tag string, in Inputs) error {
	layer, labels, goarch, err := layerFor(img, in)
	if err != nil {
		return err
	}
	im, err := OCIImage(img, layer, goarch, labels, in)
	if err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	if err := WriteOCIArchive(dst, im, img.Ref(tag), in); err != nil {
		return fmt.Errorf("image %s: %w", img.Name, err)
	}
	return nil
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

// Unpack writes the entries of a layer under dst, as a container runtime would: modes, links,
// and the security.capability xattr.
func Unpack(dst string, layer []byte) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	entries, err := readLayer(bytes.NewReader(layer))
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dst, e.hdr.Name)
		mode := os.FileMode(e.hdr.Mode & 0o777)
		switch e.hdr.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.Symlink(e.hdr.Linkname, p); err != nil {
				return err
			}
			continue
		case tar.TypeLink:
			if err := os.Link(filepath.Join(dst, e.hdr.Linkname), p); err != nil {
				return err
			}
			continue
		case tar.TypeReg:
			if err := os.WriteFile(p, e.data, mode); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: unsupported entry type %q", e.hdr.Name, e.hdr.Typeflag)
		}
		// Chmod after WriteFile (umask) and for the sticky bit, then the xattr, last: a write or
		// a chown would clear it.
		m := mode
		if e.hdr.Mode&0o1000 != 0 {
			m |= os.ModeSticky
		}
		if err := os.Chmod(p, m); err != nil {
			return err
		}
		if x, ok := e.hdr.PAXRecords[XattrCaps]; ok {
			if err := unix.Setxattr(p, "security.capability", []byte(x), 0); err != nil {
				return fmt.Errorf("%s: set file capabilities: %w", e.hdr.Name, err)
			}
		}
	}
	return nil
}
