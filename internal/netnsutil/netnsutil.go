// Package netnsutil is the one place in production code that enters Linux network namespaces
// (proxy-init --netns, the CNI plugin, the appliers that exec iptables all go through Do), so the
// rules about thread locking live in one spot.
//
// Limits: a network namespace is a property of an OS thread. Do locks a fresh goroutine to its
// thread for fn and switches only that thread, so goroutines fn starts are NOT inside the
// namespace; descriptors opened inside fn (sockets, netlink) stay bound to it after Do returns,
// usable from any goroutine; processes fn starts inherit it (Go forks from the locked thread).
//
// # Tests
//
// Entering namespaces, telling a network namespace from other files, finding a foreign user
// namespace.
package netnsutil

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Do runs fn inside the network namespace at nsPath ("" for the current one) on a locked OS thread
// and switches it back. Errors entering it name nsPath; fn's own error is returned unchanged.
// A thread that cannot be switched back stays locked and ends with fn's goroutine. The namespaces
// are opened with plain calls (vishvananda/netns), not os.Open as the CNI plugins' ns package
// does: it offers each file to the poller, three times a write.
func Do(nsPath string, fn func() error) error {
	if nsPath == "" {
		return fn()
	}
	target, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("enter netns %s: %w", nsPath, err)
	}
	defer target.Close()
	var fnErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		runtime.LockOSThread()
		home, herr := netns.GetFromPath("/proc/thread-self/ns/net")
		if err = herr; err == nil {
			defer home.Close()
			err = netns.Set(target)
		}
		if err != nil {
			runtime.UnlockOSThread()
			return
		}
		fnErr = fn()
		if netns.Set(home) == nil {
			runtime.UnlockOSThread()
		}
	})
	wg.Wait()
	if errors.Is(err, unix.EINVAL) {
		err = fmt.Errorf("%w: not a network namespace", err)
	}
	if err != nil {
		return fmt.Errorf("enter netns %s: %w", nsPath, err)
	}
	return fnErr
}

// Label names the namespace at nsPath in messages: the path, or "(current)" for "".
func Label(nsPath string) string {
	if nsPath == "" {
		return "(current)"
	}
	return nsPath
}

// Current names the thread's network namespace as the kernel does ("net:[4026532281]").
func Current() string {
	name, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		return "(unknown: " + err.Error() + ")"
	}
	return name
}

// CheckNetNS reports whether path names a network namespace, without entering it; else what it is.
func CheckNetNS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return cmp.Or(errors.Unwrap(err), err) // the *os.PathError's cause: the caller names the path
	}
	defer f.Close()
	return CheckNetNSFile(f)
}

// CheckNetNSFile is CheckNetNS for a namespace already open, so what is checked is what is used.
func CheckNetNSFile(f *os.File) error {
	var st unix.Statfs_t
	if err := unix.Fstatfs(int(f.Fd()), &st); err != nil {
		return fmt.Errorf("statfs: %w", err)
	}
	if st.Type != unix.NSFS_MAGIC {
		fi, _ := f.Stat()
		what := "a file"
		if fi != nil && fi.IsDir() {
			what = "a directory"
		}
		return fmt.Errorf("%s, not a namespace (a namespace is /proc/PID/ns/net or a bind mount of it, e.g. under /run/netns)", what)
	}
	typ, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE)
	if err != nil {
		return fmt.Errorf("ask the namespace's type: %w", err)
	}
	if typ != unix.CLONE_NEWNET {
		nsTypes := map[int]string{
			unix.CLONE_NEWNS: "mount", unix.CLONE_NEWUTS: "uts", unix.CLONE_NEWIPC: "ipc", unix.CLONE_NEWUSER: "user",
			unix.CLONE_NEWPID: "pid", unix.CLONE_NEWCGROUP: "cgroup", unix.CLONE_NEWTIME: "time",
		}
		return fmt.Errorf("a %s namespace, not a network namespace", nsTypes[typ])
	}
	return nil
}
