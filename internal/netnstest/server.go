package netnstest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Conn is one accepted connection as a server saw it.
type Conn struct {
	// ListenPort is the port of the listener that accepted it.
	ListenPort int
	// Local and Remote are the socket's addresses (IPv4 unmapped).
	Local, Remote netip.AddrPort
	// OriginalDst is what SO_ORIGINAL_DST (IPv4) or IP6T_SO_ORIGINAL_DST
	// (IPv6) reported: the destination before NAT. It is the zero (invalid)
	// AddrPort when the kernel had no conntrack entry for the connection,
	// which is the case when no nat rule exists in the namespace. When
	// conntrack saw the connection but no NAT happened it equals Local.
	OriginalDst netip.AddrPort
}

// Redirected reports whether the connection was NATed to this listener, that
// is whether its original destination differs from where it landed.
func (c Conn) Redirected() bool { return c.OriginalDst.IsValid() && c.OriginalDst != c.Local }

func (c Conn) String() string {
	return fmt.Sprintf("%s -> %s (port %d, original dst %s)", c.Remote, c.Local, c.ListenPort, c.OriginalDst)
}

// Recorder holds the connections a Proxy or Server accepted, in accept order.
// A connection is recorded before the reply line is written, so once a dial
// has read its reply the connection is already visible here; that makes
// "nothing arrived" checks after a dial exact, without waiting.
type Recorder struct {
	mu      sync.Mutex
	conns   []Conn
	next    int           // index of the next connection Expect returns
	changed chan struct{} // closed and replaced on every new connection
}

func newRecorder() *Recorder { return &Recorder{changed: make(chan struct{})} }

func (r *Recorder) add(c Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.conns = append(r.conns, c)
	close(r.changed)
	r.changed = make(chan struct{})
}

// Conns returns a copy of every connection recorded so far.
func (r *Recorder) Conns() []Conn {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Conn(nil), r.conns...)
}

// Expect returns the next connection that no earlier Expect returned, waiting
// up to timeout for it to arrive; the test fails if none does.
func (r *Recorder) Expect(t testing.TB, timeout time.Duration) Conn {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		if r.next < len(r.conns) {
			c := r.conns[r.next]
			r.next++
			r.mu.Unlock()
			return c
		}
		changed := r.changed
		seen := len(r.conns)
		r.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("no new connection within %v (%d recorded, all already expected)", timeout, seen)
			return Conn{}
		}
	}
}

// Proxy is the fake sidecar proxy: it accepts on every configured port on
// both IPv4 and IPv6 wildcards, records the original destination, answers
// "proxy <port>\n" and closes.
type Proxy struct {
	*Recorder
	Ports []int
}

// Server is a plain application or peer server: it records connections like
// the proxy and answers "server <addr>\n" with the address it was started on.
type Server struct {
	*Recorder
	Addr string
}

// StartProxy starts a fake proxy inside n listening on each port (for
// example 4140 and 4143) on 0.0.0.0 and [::]. It stops at t's cleanup.
func StartProxy(t testing.TB, n *NS, ports ...int) *Proxy {
	t.Helper()
	if len(ports) == 0 {
		t.Fatalf("StartProxy: no ports")
	}
	p := &Proxy{Recorder: newRecorder(), Ports: ports}
	for _, port := range ports {
		if port <= 0 || port > 65535 {
			t.Fatalf("StartProxy: bad port %d", port)
		}
		reply := fmt.Sprintf("proxy %d\n", port)
		startListener(t, n, p.Recorder, "tcp4", net.JoinHostPort("0.0.0.0", strconv.Itoa(port)), port, reply)
		startListener(t, n, p.Recorder, "tcp6", net.JoinHostPort("::", strconv.Itoa(port)), port, reply)
	}
	return p
}

// StartServer starts a server inside n on addr ("host:port"). An empty host
// listens on both the IPv4 and the IPv6 wildcard; otherwise the host's family
// decides. Port 0 is refused because callers need to know where to dial. It
// stops at t's cleanup.
func StartServer(t testing.TB, n *NS, addr string) *Server {
	t.Helper()
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("StartServer %q: %v", addr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 || port > 65535 {
		t.Fatalf("StartServer %q: bad port", addr)
	}
	s := &Server{Recorder: newRecorder(), Addr: addr}
	reply := "server " + addr + "\n"
	if host == "" {
		startListener(t, n, s.Recorder, "tcp4", net.JoinHostPort("0.0.0.0", portStr), port, reply)
		startListener(t, n, s.Recorder, "tcp6", net.JoinHostPort("::", portStr), port, reply)
		return s
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		t.Fatalf("StartServer %q: host must be an IP literal: %v", addr, err)
	}
	network := "tcp4"
	if ip.Is6() && !ip.Is4In6() {
		network = "tcp6"
	}
	startListener(t, n, s.Recorder, network, addr, port, reply)
	return s
}

// startListener listens inside n and serves connections until cleanup.
// Separate v4 and v6 sockets (tcp6 sets IPV6_V6ONLY) keep IPv4 peers from
// appearing as v4-mapped IPv6 addresses, whose original destination would
// need the IPv4 socket option on an IPv6 socket.
func startListener(t testing.TB, n *NS, rec *Recorder, network, addr string, port int, reply string) {
	t.Helper()
	var ln net.Listener
	if err := n.Do(func() error {
		var err error
		ln, err = net.Listen(network, addr)
		return err
	}); err != nil {
		t.Fatalf("listen %s %s in %s: %v", network, addr, n, err)
	}
	v6 := network == "tcp6"
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed at cleanup
			}
			serve(c.(*net.TCPConn), rec, port, v6, reply)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
}

func serve(c *net.TCPConn, rec *Recorder, port int, v6 bool, reply string) {
	defer c.Close()
	conn := Conn{
		ListenPort: port,
		Local:      unmap(c.LocalAddr().(*net.TCPAddr).AddrPort()),
		Remote:     unmap(c.RemoteAddr().(*net.TCPAddr).AddrPort()),
	}
	if dst, err := originalDst(c, v6); err == nil {
		conn.OriginalDst = dst
	}
	rec.add(conn)
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write([]byte(reply))
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h
// (same number as SO_ORIGINAL_DST, at level SOL_IPV6); x/sys/unix lacks it.
const ip6tSoOriginalDst = 80

// originalDst asks conntrack for the pre-NAT destination of c.
func originalDst(c *net.TCPConn, v6 bool) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("raw conn: %w", err)
	}
	var (
		buf    [unix.SizeofSockaddrInet6]byte
		size   = uint32(unix.SizeofSockaddrInet4)
		level  = unix.SOL_IP
		option = unix.SO_ORIGINAL_DST
		sysErr error
	)
	if v6 {
		size = unix.SizeofSockaddrInet6
		level = unix.SOL_IPV6
		option = ip6tSoOriginalDst
	}
	if err := raw.Control(func(fd uintptr) {
		// x/sys/unix has no getsockopt for a raw sockaddr, hence the
		// syscall; the kernel writes a sockaddr_in or sockaddr_in6.
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(level), uintptr(option),
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			sysErr = errno
		}
	}); err != nil {
		return netip.AddrPort{}, fmt.Errorf("control: %w", err)
	}
	if sysErr != nil {
		return netip.AddrPort{}, fmt.Errorf("getsockopt original dst: %w", sysErr)
	}
	return parseSockaddr(buf[:size])
}

// parseSockaddr decodes a sockaddr_in or sockaddr_in6: family in host byte
// order, then the port in network byte order, then the address.
func parseSockaddr(b []byte) (netip.AddrPort, error) {
	if len(b) < 4 {
		return netip.AddrPort{}, errors.New("short sockaddr")
	}
	family := binary.NativeEndian.Uint16(b[0:2])
	port := binary.BigEndian.Uint16(b[2:4])
	switch {
	case family == unix.AF_INET && len(b) >= unix.SizeofSockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port), nil
	case family == unix.AF_INET6 && len(b) >= unix.SizeofSockaddrInet6:
		// Bytes 4..8 are the flow info, 24..28 the scope id (unused here:
		// redirect targets are never link-local).
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])), port), nil
	default:
		return netip.AddrPort{}, fmt.Errorf("unexpected sockaddr family %d, length %d", family, len(b))
	}
}

// replyFrom trims a server reply for comparison.
func replyFrom(b []byte) string { return strings.TrimSpace(string(b)) }
