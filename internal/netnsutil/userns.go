package netnsutil

import (
	"errors"
	"fmt"
	"os"
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
	netns, err := os.Open(nsPath)
	if err != nil {
		return "", fmt.Errorf("open the network namespace: %w", err)
	}
	defer netns.Close()
	fd, err := unix.IoctlRetInt(int(netns.Fd()), unix.NS_GET_USERNS)
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
