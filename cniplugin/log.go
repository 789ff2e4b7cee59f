package cniplugin

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// newLogger returns the logger of one plugin invocation (slog text lines on stderr at level, also
// appended to logFile when set, with attrs), the writer its lines go to, for lines logged
// elsewhere (the node agent's), and a function that closes the log file. Each record is one
// write to an O_APPEND file, so concurrent plugins' lines interleave whole. A log file that
// cannot be used is reported on stderr and otherwise ignored: logging must never fail an ADD.
func newLogger(stderr io.Writer, level slog.Level, logFile string, attrs ...any) (*slog.Logger, io.Writer, func()) {
	w, closeFn := stderr, func() {}
	var f *os.File
	var openErr error
	if logFile != "" {
		if f, openErr = OpenLogFile(logFile); openErr == nil {
			w, closeFn = io.MultiWriter(stderr, f), func() { _ = f.Close() }
		}
	}
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With(attrs...)
	if openErr != nil {
		log.Warn("cannot use log_file; logging to stderr only", "log_file", logFile, "error", openErr)
	}
	return log, w, closeFn
}

// OpenLogFile opens log_file for appending, creating it (mode 0600) when missing. The plugin
// runs as root and others may reach the directory (a log shipper mounting /var/log), so it
// refuses what would turn the append into a write elsewhere: a symbolic link anywhere in the
// path, a directory not root's alone, a file not a regular one of root's with one link.
func OpenLogFile(path string) (*os.File, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("log_file %s: not an absolute path", path)
	}
	if err := checkLogDir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("log_file %s: %w", path, err)
	}
	fd, err := unix.Openat2(unix.AT_FDCWD, path, &unix.OpenHow{
		Flags:   unix.O_WRONLY | unix.O_APPEND | unix.O_CREAT | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Mode:    0o600,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if errors.Is(err, unix.ENOSYS) {
		// Before Linux 5.6: at least the file itself is not followed.
		fd, err = unix.Open(path, unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	}
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return nil, fmt.Errorf("log_file %s: refusing a path through a symbolic link", path)
		}
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, &os.PathError{Op: "stat", Path: path, Err: err}
	}
	switch {
	case st.Mode&unix.S_IFMT != unix.S_IFREG:
		err = errors.New("not a regular file")
	case st.Uid != 0:
		err = fmt.Errorf("owned by uid %d, not root", st.Uid)
	case st.Nlink != 1:
		err = fmt.Errorf("has %d hard links; a log file has one", st.Nlink)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("log_file %s: %w", path, err)
	}
	return f, nil
}

// checkLogDir refuses a directory that is not root's alone.
func checkLogDir(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case fi.Mode()&os.ModeSymlink != 0:
		return fmt.Errorf("its directory %s is a symbolic link", dir)
	case !fi.IsDir():
		return fmt.Errorf("its directory %s is not a directory", dir)
	case !ok || st.Uid != 0:
		return fmt.Errorf("its directory %s is not owned by root", dir)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("its directory %s is writable by others than root (mode %o)", dir, fi.Mode().Perm())
	}
	return nil
}
