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
package netnsutil

import (
	"fmt"
	"os"

	"github.com/containernetworking/plugins/pkg/ns"
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
