package images

import (
	"archive/tar"
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// XattrCaps is the PAX record of the security.capability xattr in a layer: the name Docker,
// BuildKit and containerd use.
const XattrCaps = "SCHILY.xattr.security.capability"

// Inputs are what an image is built from.
type Inputs struct {
	// BinDir holds the binaries (`make build`'s bin/).
	BinDir string
	// RepoDir is the repository root, for Repo files.
	RepoDir string
	// Debs are the Debian packages Layer extracts; the builders fetch them (FetchDebs) into
	// DebCache ("": DefaultDebCache).
	Debs     []DebPackage
	DebCache string
	// Epoch is every file's modification time and the image's creation time, so that the same
	// inputs give the same image.
	Epoch time.Time
}

// entry is one file of a layer.
type entry struct {
	hdr  tar.Header
	data []byte
}

// Layer returns img's file system as an uncompressed tar stream: parents before children,
// sorted, owned by root, stamped with in.Epoch, file capabilities as PAX xattr records.
func Layer(img Image, in Inputs) ([]byte, error) {
	entries := map[string]*entry{}
	for _, pkg := range img.Debian {
		if err := addDeb(entries, in.Debs, pkg); err != nil {
			return nil, fmt.Errorf("image %s: %w", img.Name, err)
		}
	}
	files := img.Files
	if !img.OverBase {
		files = append(append([]File{}, baseFiles...), files...)
	}
	for _, f := range files {
		if err := addFile(entries, f, in); err != nil {
			return nil, fmt.Errorf("image %s: %s: %w", img.Name, f.Path, err)
		}
	}
	// Every parent directory gets its own entry, so that no unpacker has to invent one.
	for name := range entries {
		for dir := path.Dir(name); dir != "."; dir = path.Dir(dir) {
			if _, ok := entries[dir]; !ok {
				entries[dir] = &entry{hdr: tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755}}
			}
		}
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, name := range slices.Sorted(maps.Keys(entries)) {
		e := entries[name]
		h := e.hdr
		h.Name = name
		if h.Typeflag == tar.TypeDir {
			h.Name += "/"
		}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.ModTime, h.AccessTime, h.ChangeTime = in.Epoch, time.Time{}, time.Time{}
		h.Format = tar.FormatPAX
		h.Size = int64(len(e.data))
		if err := tw.WriteHeader(&h); err != nil {
			return nil, fmt.Errorf("image %s: %s: %w", img.Name, name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, fmt.Errorf("image %s: %s: %w", img.Name, name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// addFile adds one entry of the layout.
func addFile(entries map[string]*entry, f File, in Inputs) error {
	name := strings.TrimPrefix(path.Clean(f.Path), "/")
	if !path.IsAbs(f.Path) || name == "" {
		return fmt.Errorf("not an absolute path")
	}
	var e *entry
	def := fs.FileMode(0o644) // the mode when f.Mode is not set
	switch {
	case f.Debian:
		e = entries[name]
		if e == nil || e.hdr.Typeflag != tar.TypeReg {
			return fmt.Errorf("not a regular file of the image's Debian packages")
		}
		def = fs.FileMode(e.hdr.Mode)
	case f.Link != "":
		e = &entry{hdr: tar.Header{Typeflag: tar.TypeSymlink, Linkname: f.Link}}
		f.Mode = 0o777
	case f.Dir:
		e = &entry{hdr: tar.Header{Typeflag: tar.TypeDir}}
		def = 0o755
	case f.Bin != "" || f.Repo != "":
		src := filepath.Join(in.BinDir, f.Bin)
		if f.Repo != "" {
			src = filepath.Join(in.RepoDir, f.Repo)
		} else {
			def = 0o755
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		e = &entry{hdr: tar.Header{Typeflag: tar.TypeReg}, data: data}
	default:
		return fmt.Errorf("no source: set one of Bin, Repo, Link, Dir or Debian")
	}
	e.hdr.Mode = tarMode(cmp.Or(f.Mode, def))
	if f.Caps != "" {
		if e.hdr.Typeflag != tar.TypeReg {
			return fmt.Errorf("capabilities %q on a file that is not regular", f.Caps)
		}
		x, err := CapXattr(f.Caps)
		if err != nil {
			return err
		}
		e.hdr.PAXRecords = map[string]string{XattrCaps: string(x)}
	}
	entries[name] = e
	return nil
}

// tarMode turns Go's mode bits into the tar header's (which keeps setuid, setgid and sticky in
// the Unix positions).
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// Capability numbers (linux/capability.h) of the names layouts use.
var capNumbers = map[string]uint{
	"cap_net_bind_service": 10,
	"cap_net_admin":        12,
	"cap_net_raw":          13,
}

// CapXattr encodes file capabilities in setcap's syntax ("cap_a,cap_b+eip": flags from e, p and
// i) as the security.capability xattr value, revision 2 (what setcap writes outside user
// namespaces).
func CapXattr(s string) ([]byte, error) {
	names, flags, ok := strings.Cut(s, "+")
	if !ok || names == "" || flags == "" {
		return nil, fmt.Errorf("capabilities %q: want names+flags, such as cap_net_admin,cap_net_raw+ep", s)
	}
	var set uint64
	for _, n := range strings.Split(names, ",") {
		num, ok := capNumbers[n]
		if !ok {
			return nil, fmt.Errorf("capabilities %q: unknown capability %q", s, n)
		}
		set |= 1 << num
	}
	const revision2, effective = 0x02000000, 0x1
	magic := uint32(revision2)
	var permitted, inheritable uint64
	for _, f := range flags {
		switch f {
		case 'e':
			magic |= effective
		case 'p':
			permitted = set
		case 'i':
			inheritable = set
		default:
			return nil, fmt.Errorf("capabilities %q: unknown flag %q; want e, p or i", s, f)
		}
	}
	var b []byte
	for _, v := range []uint64{uint64(magic), permitted, inheritable, permitted >> 32, inheritable >> 32} {
		b = binary.LittleEndian.AppendUint32(b, uint32(v))
	}
	return b, nil
}

// readLayer reads a layer back into entries by name (without the trailing slash of
// directories), for extraction and checks.
func readLayer(r io.Reader) ([]*entry, error) {
	var out []*entry
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		h.Name = strings.TrimSuffix(h.Name, "/")
		out = append(out, &entry{hdr: *h, data: data})
	}
}
