// Package netnstest is the integration-test harness for everything that
// writes netfilter rules: throwaway network namespaces, a veth-linked
// pod/peer pair, a fake proxy that reports SO_ORIGINAL_DST, plain servers,
// a dialer that can act as another UID/GID, and a way to run commands
// (iptables-save, nft, ip) inside a namespace.
//
// Safety: every namespace is created fresh by the harness (bind-mounted under
// /var/run/netns by containernetworking's testutils) and removed with
// t.Cleanup. Veth pairs are created inside the pod namespace with the other
// end placed directly in the peer namespace, so nothing is ever linked to, or
// written into, the machine's root network namespace. Addresses come only from
// the documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24,
// 2001:db8::/32).
//
// Limits: everything here needs root (call RequireRoot first); namespaces are
// entered through internal/netnsutil, so callbacks run on a locked OS thread
// and goroutines they start are not inside the namespace. The harness speaks
// TCP only.
//
// # Tests
//
// Its own tests: fresh namespaces that are cleaned up, and the child guard.
package netnstest

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
)

// RequireRoot skips the test (or benchmark) unless it runs as root, saying why it needs root:
// why, when given, else that it creates network namespaces. CI runs as root, so there these tests
// always run. It is the one root check of the tests.
func RequireRoot(t testing.TB, why ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		reason := "creates network namespaces, veth pairs and netfilter rules"
		if len(why) > 0 {
			reason = strings.Join(why, " ")
		}
		t.Skip("needs root: " + reason + " (run as root; CI does)")
	}
}

// NS is one network namespace used by a test.
type NS struct {
	name string
	path string
}

// Path returns the namespace's bind-mount path (for --netns, CNI_NETNS, ...).
func (n *NS) Path() string { return n.path }

// Name returns the short role name given at creation ("pod", "peer", "ns"),
// used in messages.
func (n *NS) Name() string { return n.name }

// String implements fmt.Stringer for messages.
func (n *NS) String() string { return n.name + "(" + n.path + ")" }

// Do runs fn inside the namespace; see netnsutil.Do for the threading rules.
func (n *NS) Do(fn func() error) error { return netnsutil.Do(n.path, fn) }

// Existing wraps a namespace the harness did not create (for example one
// created by a CNI runtime under test) so the dialers, servers and RunIn can be
// used with it. The harness never removes it.
func Existing(name, path string) *NS { return &NS{name: name, path: path} }

// NewNS creates a fresh, empty network namespace with lo up and IPv6 DAD off,
// removed again by t.Cleanup.
func NewNS(t testing.TB) *NS {
	t.Helper()
	return newNS(t, "ns")
}

// NewNetNS creates a fresh, empty network namespace (lo down, as the kernel makes it) and returns
// the containernetworking handle, for tests that need its file descriptor; it is removed again by
// t.Cleanup. It is the one place tests create namespaces.
func NewNetNS(t testing.TB) ns.NetNS {
	t.Helper()
	RequireRoot(t)
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() { closeNS(t, netns) })
	return netns
}

func newNS(t testing.TB, name string) *NS {
	t.Helper()
	return setUp(t, &NS{name: name, path: NewNetNS(t).Path()})
}

// setUp brings lo up and switches IPv6 DAD off in n.
func setUp(t testing.TB, n *NS) *NS {
	t.Helper()

	if err := n.Do(func() error {
		// DAD would keep new IPv6 addresses tentative for a second or more;
		// nothing else shares these links, so switch it off for every
		// interface created from now on (the addresses also carry NODAD).
		for _, p := range []string{"net/ipv6/conf/all/accept_dad", "net/ipv6/conf/default/accept_dad"} {
			if err := os.WriteFile(filepath.Join("/proc/sys", p), []byte("0"), 0o644); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("write sysctl %s: %w", p, err)
			}
		}
		h, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("open netlink: %w", err)
		}
		defer h.Close()
		lo, err := h.LinkByName("lo")
		if err != nil {
			return fmt.Errorf("find lo: %w", err)
		}
		if err := h.LinkSetUp(lo); err != nil {
			return fmt.Errorf("set lo up: %w", err)
		}
		return nil
	}); err != nil {
		t.Fatalf("set up %s netns %s: %v", n.name, n.path, err)
	}
	return n
}

func closeNS(t testing.TB, netns ns.NetNS) {
	t.Helper()
	path := netns.Path()
	if err := netns.Close(); err != nil {
		t.Errorf("close netns %s: %v", path, err)
	}
	if err := testutils.UnmountNS(netns); err != nil {
		t.Errorf("unmount netns %s: %v", path, err)
	}
}

// runTimeout bounds every command RunIn starts, so a hung iptables lock or
// similar cannot stall a whole test binary.
const runTimeout = 60 * time.Second

// RunIn runs the command inside n and returns its combined stdout and stderr.
// The child inherits the namespace because it is started from inside
// netnsutil.Do. A non-zero exit is returned as an error that includes the
// command line and its output.
func RunIn(t testing.TB, n *NS, name string, args ...string) (string, error) {
	t.Helper()
	return RunInWithInput(t, n, "", name, args...)
}

// Output runs the command inside n with stdin fed from input, and returns its
// stdout and stderr apart, so that a warning on stderr cannot hide in the output
// a test compares. A failure to run it, or a non-zero exit, fails the test.
func Output(t testing.TB, n *NS, input, name string, args ...string) (stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	var o, e strings.Builder
	err := n.Do(func() error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdin = strings.NewReader(input)
		cmd.Stdout, cmd.Stderr = &o, &e
		return cmd.Run()
	})
	if err != nil {
		t.Fatalf("%s %s in %s: %v\nstdout:\n%s\nstderr:\n%s", name, strings.Join(args, " "), n, err, o.String(), e.String())
	}
	return o.String(), e.String()
}

// RunInWithInput is RunIn with stdin fed from input (for iptables-restore,
// nft -f -, ...).
func RunInWithInput(t testing.TB, n *NS, input, name string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), runTimeout)
	defer cancel()
	var out []byte
	err := n.Do(func() error {
		cmd := exec.CommandContext(ctx, name, args...)
		if input != "" {
			cmd.Stdin = strings.NewReader(input)
		}
		var err error
		out, err = cmd.CombinedOutput()
		return err
	})
	if err != nil {
		return string(out), fmt.Errorf("run %s %s in %s: %w: %s", name, strings.Join(args, " "), n, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}
