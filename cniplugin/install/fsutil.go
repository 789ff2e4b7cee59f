package install

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// tmpPrefix starts the installer's temporary files' names: with the leading dot and no
// .conf/.conflist/.json extension, no CNI runtime reads one, and the installer ignores them.
const tmpPrefix = ".linkerd-cni-tmp-"

// writeAtomic replaces path with data, owned like ownerOf (the primary CNI's config is theirs), or
// by root when "" (every file of ours), whoever owned the one it replaces.
func writeAtomic(path string, data []byte, mode fs.FileMode, ownerOf string) error {
	return replaceFile(path, bytes.NewReader(data), mode, ownerOf, "write "+path)
}

// writeLike is writeAtomic keeping like's permission bits (0644 when it is gone) and owner.
func writeLike(path string, data []byte, like string) error {
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(like); err == nil {
		mode = fi.Mode().Perm()
	}
	return writeAtomic(path, data, mode, like)
}

// replaceFile copies r into a temporary file in path's directory, syncs it, gives it mode and
// ownerOf's owner, and renames it over path, so a reader sees the old or the new content, never a
// mix; the directory is synced so the rename survives a crash. what starts its errors.
func replaceFile(path string, r io.Reader, mode fs.FileMode, ownerOf, what string) error {
	f, err := os.CreateTemp(filepath.Dir(path), tmpPrefix+"*")
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	defer os.Remove(f.Name()) // a no-op after the rename
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = f.Chmod(mode) // CreateTemp's 0600 and the umask are not what we want
	}
	if err == nil {
		uid, gid := 0, 0
		if fi, serr := os.Stat(ownerOf); ownerOf != "" && serr == nil {
			st := fi.Sys().(*syscall.Stat_t) // always, on Linux
			uid, gid = int(st.Uid), int(st.Gid)
		}
		if cerr := f.Chown(uid, gid); cerr != nil && os.Geteuid() == 0 {
			err = cerr // only root can chown: an unprivileged test's files stay its own
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// inPlace reports whether path is already a file of ours holding want: root's, with mode.
func inPlace(path string, want []byte, mode fs.FileMode) bool {
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != mode {
		return false
	}
	if fi.Sys().(*syscall.Stat_t).Uid != 0 && os.Geteuid() == 0 {
		return false
	}
	have, err := os.ReadFile(path)
	return err == nil && bytes.Equal(have, want)
}

// copyFileAtomic copies src to dst like writeAtomic, with src's permission bits, owned by root: a
// runtime executing dst meanwhile runs the old binary (no "text file busy": the inode stays). In one
// write: the kernel then caches it in large folios where it can, faster to exec (performance.md).
func copyFileAtomic(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	if !fi.Mode().IsRegular() { // before reading: a FIFO would block
		return fmt.Errorf("copy: %s is not a regular file", src)
	}
	data, err := os.ReadFile(src)
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	return replaceFile(dst, bytes.NewReader(data), fi.Mode().Perm(), "", "copy "+src+" to "+dst)
}

// fileID identifies a file's version: a rename changes the inode, a write its size or mtime.
type fileID struct {
	ino, size int64
	mtime     int64
	mode      fs.FileMode
}

func statID(path string) (fileID, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileID{}, err
	}
	ino := int64(fi.Sys().(*syscall.Stat_t).Ino)
	return fileID{ino: ino, size: fi.Size(), mtime: fi.ModTime().UnixNano(), mode: fi.Mode()}, nil
}

func hashOf(data []byte) [32]byte { return sha256.Sum256(data) }

// removeIfExists removes path; a missing file is not an error.
func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// MaxConfigSize bounds a CNI config file the installer reads (real ones are a few KB): a file read
// whole could exhaust its memory limit in an OOM-kill loop. A larger one is reported and left.
const MaxConfigSize = 1 << 20

// tooBigError is a config file over MaxConfigSize.
type tooBigError struct {
	path string
	size int64
}

func (e *tooBigError) Error() string {
	return fmt.Sprintf("%s is %d bytes, over the %d-byte (1 MiB) bound on a CNI config file: not read, left untouched", e.path, e.size, MaxConfigSize)
}

// readConfig reads a config file, never more than MaxConfigSize+1 bytes (it may grow while read),
// following no symbolic link, not blocking on a FIFO, refusing anything but a regular file.
func readConfig(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (mode %s)", path, fi.Mode())
	}
	if fi.Size() > MaxConfigSize {
		return nil, &tooBigError{path: path, size: fi.Size()}
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxConfigSize {
		return nil, &tooBigError{path: path, size: max(fi.Size(), int64(len(data)))}
	}
	return data, nil
}
