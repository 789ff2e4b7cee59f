package install

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// checkLogFile checks the entry's log_file (a path on the node, under prefix here) as the plugin,
// appending as root, will: absent, or a regular file of root's with one link, in a directory of
// root's nobody else may write, reached through no symbolic link ("root" is the installer's user).
// The plugin refuses anything else; /ready says so before a pod's log line is lost.
func checkLogFile(prefix, logFile string) error {
	bad := func(reason string) error { return fmt.Errorf("log_file %s: %s", logFile, reason) }
	if !filepath.IsAbs(logFile) {
		return bad("not an absolute path")
	}
	root := uint32(os.Geteuid())
	clean := filepath.Clean(logFile)
	// Every directory from the node's root down, then the file: none may be a symbolic link.
	parts := strings.Split(strings.TrimPrefix(clean, "/"), "/")
	node := "/"
	for i, p := range parts {
		node = filepath.Join(node, p)
		fi, err := os.Lstat(filepath.Join(prefix, node))
		last := i == len(parts)-1
		switch {
		case errors.Is(err, fs.ErrNotExist) && last:
			return nil // the plugin creates it, root's and 0600, in a directory that passed below
		case errors.Is(err, fs.ErrNotExist):
			return bad(fmt.Sprintf("its directory %s does not exist on the node (or is not mounted into install-cni at %s)", node, filepath.Join(prefix, node)))
		case err != nil:
			return bad(err.Error())
		case fi.Mode()&fs.ModeSymlink != 0:
			return bad(fmt.Sprintf("%s is a symbolic link: the plugin opens no path through one", node))
		}
		st := fi.Sys().(*syscall.Stat_t) // always, on Linux
		if last {
			switch {
			case !fi.Mode().IsRegular():
				return bad(fmt.Sprintf("not a regular file (mode %s)", fi.Mode()))
			case st.Uid != root:
				return bad(fmt.Sprintf("owned by uid %d, not root", st.Uid))
			case st.Nlink != 1:
				return bad(fmt.Sprintf("has %d hard links; a log file has one", st.Nlink))
			}
			return nil
		}
		if i == len(parts)-2 { // the file's own directory
			switch {
			case !fi.IsDir():
				return bad(fmt.Sprintf("its directory %s is not a directory", node))
			case st.Uid != root:
				return bad(fmt.Sprintf("its directory %s is owned by uid %d, not root", node, st.Uid))
			case fi.Mode().Perm()&0o022 != 0:
				return bad(fmt.Sprintf("its directory %s is writable by others than root (mode %o)", node, fi.Mode().Perm()))
			}
		}
	}
	return nil
}
