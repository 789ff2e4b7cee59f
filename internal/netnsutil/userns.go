package netnsutil

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// ForeignUserNS names the user namespace that owns the network namespace at nsPath ("" for the
// calling thread's) as the kernel does ("user:[4026532281]") when it is not the caller's own (a
// pod with hostUsers: false, seen from the host), else "". It costs an open, an ioctl and two
// stats. An owner the caller may not see (EPERM) or a kernel before 4.9 gives "": the caller can
// only write as it always does.
func ForeignUserNS(nsPath string) (string, error) {
	if nsPath == "" {
		nsPath = "/proc/thread-self/ns/net"
	}
	netns, err := unix.Open(nsPath, unix.O_RDONLY|unix.O_CLOEXEC, 0) // not os.Open: see ReadProc
	if err != nil {
		return "", fmt.Errorf("open the network namespace: %w", &os.PathError{Op: "open", Path: nsPath, Err: err})
	}
	defer unix.Close(netns)
	fd, err := unix.IoctlRetInt(netns, unix.NS_GET_USERNS)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("ask netns %s for its user namespace: %w", nsPath, err)
	}
	defer unix.Close(fd)
	var have, ours unix.Stat_t
	if err := unix.Fstat(fd, &have); err != nil {
		return "", fmt.Errorf("stat the user namespace of netns %s: %w", nsPath, err)
	}
	if err := unix.Stat("/proc/self/ns/user", &ours); err != nil {
		return "", fmt.Errorf("stat our own user namespace: %w", err)
	}
	if have.Dev == ours.Dev && have.Ino == ours.Ino {
		return "", nil
	}
	return "user:[" + strconv.FormatUint(have.Ino, 10) + "]", nil
}

// ReadProc reads a small /proc file (at most 64 KiB: a status, an fdinfo, a uid_map) with plain
// system calls: os.Open would also set the descriptor non-blocking and offer it to the poller,
// four more calls per file, on every plugin call and agent write.
func ReadProc(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 0, 4096)
	for len(buf) < 64<<10 {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, cap(buf))
		}
		n, err := unix.Read(fd, buf[len(buf):cap(buf)])
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		case n == 0:
			return buf, nil
		}
		buf = buf[:len(buf)+n]
	}
	return nil, fmt.Errorf("%s: larger than 64 KiB", path)
}
