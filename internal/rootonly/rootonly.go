// Package rootonly makes and checks the node's directories where linkerd-cni keeps what decides,
// as root, how it writes a pod's rules (lock files, records of pod settings): only the plugin's
// user may reach them, so nothing unprivileged can hold, plant or remove what is in them.
// Limits: standard library only (the plugin links it); checked where used, not watched.
package rootonly

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Make creates dir (and parents) with mode 0700 and checks it; an existing one is never changed.
func Make(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make the directory %s: %w", dir, err)
	}
	return Check(dir)
}

// Check refuses dir unless it is a directory (not a symlink) of this process's user, closed to
// group and others, in a parent only that user may write. A missing dir is fs.ErrNotExist.
func Check(dir string) error {
	if err := check(dir, 0o077); err != nil {
		return err
	}
	return check(filepath.Dir(filepath.Clean(dir)), 0o022)
}

func check(dir string, forbidden fs.FileMode) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("refusing %s: not a directory (mode %s)", dir, fi.Mode())
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return errors.New("refusing " + dir + ": no owner")
	}
	if uid := os.Geteuid(); int(st.Uid) != uid {
		return fmt.Errorf("refusing %s: owned by uid %d, not %d", dir, st.Uid, uid)
	}
	if perm := fi.Mode().Perm(); perm&forbidden != 0 {
		return fmt.Errorf("refusing %s: mode %04o gives others access (want at most %04o)", dir, perm, 0o777&^forbidden)
	}
	return nil
}
