package netnstest

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultDialTimeout applies when DialOpts.Timeout is zero.
const DefaultDialTimeout = 3 * time.Second

// DialOpts tunes Dial.
type DialOpts struct {
	// UID and GID the socket is created as. -1 or 0 leaves the harness's
	// own (root) identity; any positive value is what iptables' owner match
	// (--uid-owner/--gid-owner) and nftables' meta skuid/skgid then see.
	UID, GID int
	// Timeout bounds connect and reading the reply (DefaultDialTimeout if 0).
	Timeout time.Duration
	// Source, if valid, is bound as the local address before connecting
	// (for example a peer's extra address, to test source-subnet skips).
	Source netip.Addr
}

// Dial connects from inside n to addr over network ("tcp", "tcp4", "tcp6"; "udp", "udp4",
// "udp6" send one datagram and read one back),
// reads the one-line reply and returns it without the newline: "proxy 4140"
// when the fake proxy answered, "server <addr>" when a Server did. A refused,
// timed-out or unanswered connection is returned as an error, never a test
// failure, so tests can assert that a path is closed.
//
// With a UID or GID the connection is made on a dedicated OS thread that
// enters n, switches only its own credentials with the raw per-thread
// setgroups/setresgid/setresuid system calls (syscall.Setuid would change
// every thread of the test binary), and creates and connects the socket. A
// socket's owner for netfilter is the credentials it was created with, so
// owner matches see the new UID/GID. That thread is never unlocked, so the Go
// runtime destroys it when the goroutine ends instead of reusing it.
func Dial(t testing.TB, n *NS, network, addr string, opts DialOpts) (string, error) {
	t.Helper()
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultDialTimeout
	}
	type result struct {
		reply string
		err   error
	}
	done := make(chan result, 1)
	go func() {
		// Deliberately no UnlockOSThread: the thread's namespace and
		// credentials are changed and it must die with this goroutine.
		runtime.LockOSThread()
		reply, err := dialOnThread(n, network, addr, opts)
		done <- result{reply, err}
	}()
	r := <-done
	if r.err != nil {
		return r.reply, fmt.Errorf("dial %s %s from %s (uid %d, gid %d): %w", network, addr, n.Name(), opts.UID, opts.GID, r.err)
	}
	return r.reply, nil
}

// dialOnThread must run on a locked OS thread that may be discarded.
func dialOnThread(n *NS, network, addr string, opts DialOpts) (string, error) {
	f, err := os.Open(n.Path())
	if err != nil {
		return "", fmt.Errorf("open netns: %w", err)
	}
	err = unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
	f.Close()
	if err != nil {
		return "", fmt.Errorf("enter netns %s: %w", n.Path(), err)
	}
	// Order matters: changing groups needs CAP_SETGID, which is gone once the
	// UID is no longer 0.
	if opts.GID > 0 {
		if _, _, errno := unix.RawSyscall(unix.SYS_SETGROUPS, 0, 0, 0); errno != 0 {
			return "", fmt.Errorf("setgroups: %w", errno)
		}
		g := uintptr(opts.GID)
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESGID, g, g, g); errno != 0 {
			return "", fmt.Errorf("setresgid %d: %w", opts.GID, errno)
		}
	}
	if opts.UID > 0 {
		u := uintptr(opts.UID)
		if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, u, u, u); errno != 0 {
			return "", fmt.Errorf("setresuid %d: %w", opts.UID, errno)
		}
	}
	// net.Dialer creates the socket and connects on the calling goroutine,
	// hence on this thread, for an IP-literal address.
	d := net.Dialer{Timeout: opts.Timeout}
	if opts.Source.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: net.IP(opts.Source.AsSlice())}
	}
	c, err := d.Dial(network, addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(opts.Timeout)); err != nil {
		return "", fmt.Errorf("set deadline: %w", err)
	}
	if strings.HasPrefix(network, "udp") {
		// One datagram each way: a connected UDP socket takes replies only from addr, so a
		// reply proves that whatever answered did so under addr.
		if _, err := c.Write([]byte("query\n")); err != nil {
			return "", fmt.Errorf("send: %w", err)
		}
		b := make([]byte, 512)
		n, err := c.Read(b)
		if err != nil {
			return "", fmt.Errorf("read reply: %w", err)
		}
		return replyFrom(b[:n]), nil
	}
	b, err := io.ReadAll(io.LimitReader(c, 4096))
	if err != nil {
		return replyFrom(b), fmt.Errorf("read reply: %w", err)
	}
	if len(b) == 0 {
		return "", fmt.Errorf("connected to %s but got no reply", c.RemoteAddr())
	}
	return replyFrom(b), nil
}
