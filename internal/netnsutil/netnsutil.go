// Package netnsutil is the one place in production code that enters Linux
// network namespaces.
//
// Everything else (the proxy-init --netns flag, the CNI plugin acting on a pod
// sandbox, the appliers that exec iptables binaries) funnels through Do, so the
// rules about thread locking live in exactly one spot.
//
// Limits: a network namespace is a property of an OS thread, not of a
// goroutine. Do locks a fresh goroutine to its thread for the duration of fn
// and switches only that thread, so:
//   - goroutines started by fn run on other threads and are NOT inside the
//     namespace (unless they enter it themselves);
//   - file descriptors opened inside fn (sockets, netlink handles) stay bound to
//     the namespace after Do returns and may be used from any goroutine;
//   - child processes started from inside fn (os/exec) inherit the namespace,
//     because the Go runtime forks them from the calling, locked thread.
//
// # Tests
//
// Its tests: entering namespaces, telling a network namespace from other files, finding a foreign
// user namespace.
package netnsutil

import (
	"errors"
	"fmt"
	"os"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// Do runs fn inside the network namespace at nsPath (for example
// /var/run/netns/NAME or /proc/PID/ns/net) on a locked OS thread and switches
// the thread back afterwards. An empty nsPath means the current namespace: fn
// is simply called.
//
// Errors from opening or entering the namespace name nsPath; fn's own error is
// returned unchanged so callers can inspect it with errors.Is/As.
func Do(nsPath string, fn func() error) error {
	if nsPath == "" {
		return fn()
	}
	var fnErr error
	ran := false
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		ran = true
		fnErr = fn()
		return fnErr
	})
	if ran {
		// fn ran, so err is fn's own error (ns.Do reports a failure to switch
		// back only by discarding the thread): return it unwrapped.
		return fnErr
	}
	if err != nil {
		return fmt.Errorf("enter netns %s: %w", nsPath, err)
	}
	return nil
}

// Label names the namespace at nsPath in messages and logs: the path, or "(current)" for the
// empty path Do takes as the current namespace.
func Label(nsPath string) string {
	if nsPath == "" {
		return "(current)"
	}
	return nsPath
}

// Current names the calling thread's network namespace as the kernel does ("net:[4026532281]",
// what `ls -l /proc/PID/ns/net` shows), for messages. Call it from inside Do to name the
// namespace entered.
func Current() string {
	name, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		return "(unknown: " + err.Error() + ")"
	}
	return name
}

// CheckNetNS reports whether path names a network namespace (an nsfs file of type CLONE_NEWNET,
// such as /proc/PID/ns/net or a bind mount of one under /run/netns), without entering it. The
// error says what path is instead: missing, a plain file or directory, or another kind of
// namespace.
func CheckNetNS(path string) error {
	f, err := os.Open(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			return pe.Err
		}
		return err
	}
	defer f.Close()
	return CheckNetNSFile(f)
}

// CheckNetNSFile is CheckNetNS for a namespace already open, so that what is checked is what is
// then used: no path is looked up again.
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
		return fmt.Errorf("a %s namespace, not a network namespace", nsTypes[typ])
	}
	return nil
}

var nsTypes = map[int]string{
	unix.CLONE_NEWNS: "mount", unix.CLONE_NEWUTS: "uts", unix.CLONE_NEWIPC: "ipc", unix.CLONE_NEWUSER: "user",
	unix.CLONE_NEWPID: "pid", unix.CLONE_NEWCGROUP: "cgroup", unix.CLONE_NEWTIME: "time",
}
