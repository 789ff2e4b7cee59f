package images

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations of the index entry. containerd names an imported image after the first
// (`ctr images import` needs no --base-name); the second is the OCI layout's tag.
const (
	AnnotationImageName = "io.containerd.image.name"
	AnnotationRefName   = "org.opencontainers.image.ref.name"
)

// AnnotationVersion is the release version, on each image index.
const AnnotationVersion = "org.opencontainers.image.version"

// LabelDebian lists the Debian packages in an image, as package=version.
const LabelDebian = "io.kubemesh.debian-packages"

// Ref is the image's full name for tag.
func (img Image) Ref(tag string) string { return img.Repository + ":" + tag + img.TagSuffix }

// goArches are Go's names of the ELF machines.
var goArches = map[elf.Machine]string{
	elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64", elf.EM_ARM: "arm", elf.EM_386: "386",
	elf.EM_PPC64: "ppc64le", elf.EM_S390: "s390x", elf.EM_RISCV: "riscv64",
}

// GoArch returns the architecture of the ELF binary at path, as Go names it.
func GoArch(path string) (string, error) {
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("read the architecture of %s: %w", path, err)
	}
	defer f.Close()
	if arch, ok := goArches[f.Machine]; ok {
		return arch, nil
	}
	return "", fmt.Errorf("%s: unsupported machine %v", path, f.Machine)
}

// OCIImage assembles img from its layer for goarch: a single gzip layer, and a configuration
// that carries the OS and architecture (containerd will not unpack an image without them), the
// entrypoint, command and user, created at in.Epoch.
func OCIImage(img Image, layerTar []byte, goarch string, labels map[string]string, in Inputs) (v1.Image, error) {
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	out, err := mutate.Append(base, mutate.Addendum{Layer: layer, History: v1.History{
		Created: v1.Time{Time: in.Epoch}, CreatedBy: "tools/images: " + img.Name,
	}})
	if err != nil {
		return nil, err
	}
	cf, err := out.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", goarch
	cf.Created = v1.Time{Time: in.Epoch}
	cf.Config = v1.Config{
		Entrypoint: img.Entrypoint,
		Cmd:        img.Cmd,
		User:       img.User,
		Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		Labels:     labels,
	}
	return mutate.ConfigFile(out, cf)
}

// WriteOCIArchive writes item (a v1.Image or a v1.ImageIndex) as an OCI image layout in a tar
// archive at dst, its index entry annotated with ref (and ref's tag), the files sorted and
// stamped with in.Epoch.
func WriteOCIArchive(dst string, item any, ref string, in Inputs) error {
	dir, err := os.MkdirTemp("", "oci-layout-")
	if err != nil {
		return fmt.Errorf("temporary directory: %w", err)
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return fmt.Errorf("write OCI layout: %w", err)
	}
	tag := ref[strings.LastIndex(ref, ":")+1:]
	ann := layout.WithAnnotations(map[string]string{AnnotationImageName: ref, AnnotationRefName: tag})
	switch item := item.(type) {
	case v1.Image:
		err = p.AppendImage(item, ann)
	case v1.ImageIndex:
		err = p.AppendIndex(item, ann)
	default:
		err = fmt.Errorf("%T is neither an image nor an index", item)
	}
	if err != nil {
		return fmt.Errorf("write OCI layout: %w", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	// WalkDir's lexical order keeps the archive the same for the same image.
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		h := &tar.Header{Name: filepath.ToSlash(rel) + "/", Mode: 0o755, ModTime: in.Epoch, Typeflag: tar.TypeDir}
		if d.IsDir() {
			return tw.WriteHeader(h)
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		h.Name, h.Mode, h.Typeflag, h.Size = filepath.ToSlash(rel), 0o644, tar.TypeReg, int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	tmp := dst + ".tmp"
	defer os.Remove(tmp)
	if err := os.WriteFile(tmp, buf.Bytes(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}
