package install

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// tmpPrefix starts the names of the installer's temporary files. The
// leading dot and the missing .conf/.conflist extension keep CNI runtimes,
// which load only *.conf, *.conflist and *.json, from ever reading one, and
// the installer from reacting to them.
const tmpPrefix = ".linkerd-cni-tmp-"

// writeAtomic replaces path with data: a temporary file in the same
// directory is written, synced, given mode (and the replaced file's owner)
// and renamed over path, so a reader sees the old or the new content, never
// a mix. The directory is synced so the rename survives a crash.
func writeAtomic(path string, data []byte, mode fs.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, tmpPrefix+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // a no-op after the rename
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := finishTemp(f, path, mode); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	syncDir(dir)
	return nil
}

// finishTemp syncs, chmods (CreateTemp's 0600 and the umask are not what we
// want), copies the owner of the file it will replace, and closes f.
func finishTemp(f *os.File, target string, mode fs.FileMode) error {
	err := f.Sync()
	if err == nil {
		err = f.Chmod(mode)
	}
	if err == nil {
		if fi, serr := os.Stat(target); serr == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				// Best effort: an unprivileged test cannot chown.
				_ = f.Chown(int(st.Uid), int(st.Gid))
			}
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", target, err)
	}
	return nil
}

func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// copyFileAtomic copies src to dst through a temporary file and a rename,
// keeping src's permission bits. A runtime executing dst meanwhile sees the
// old or the new binary, never a half-written one ("text file busy" cannot
// happen either: the old inode is left alone).
func copyFileAtomic(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return fmt.Errorf("copy: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("copy: %s is not a regular file", src)
	}
	f, err := os.CreateTemp(filepath.Dir(dst), tmpPrefix+"*")
	if err != nil {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if _, err := io.Copy(f, in); err != nil {
		f.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if err := finishTemp(f, dst, fi.Mode().Perm()); err != nil {
		return err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("copy to %s: %w", dst, err)
	}
	syncDir(filepath.Dir(dst))
	return nil
}

// fileID identifies a file's version cheaply: a rename-based write always
// changes the inode, and any in-place write changes size or mtime.
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
	id := fileID{size: fi.Size(), mtime: fi.ModTime().UnixNano(), mode: fi.Mode()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		id.ino = int64(st.Ino)
	}
	return id, nil
}

func hashOf(data []byte) [32]byte { return sha256.Sum256(data) }

// removeIfExists removes path; a missing file is not an error.
func removeIfExists(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}
