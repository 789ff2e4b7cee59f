package netnstest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/internal/origdst"
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

// StartTransparentProxy is StartProxy with IP_TRANSPARENT (IPV6_TRANSPARENT) on its listeners,
// as a proxy behind TPROXY has: TPROXY hands a connection only to a transparent listener, and
// the accepted socket's local address is the connection's original destination.
func StartTransparentProxy(t testing.TB, n *NS, ports ...int) *Proxy {
	t.Helper()
	p := &Proxy{Recorder: newRecorder(), Ports: ports}
	for _, port := range ports {
		reply := fmt.Sprintf("proxy %d\n", port)
		for _, l := range []struct{ network, host string }{{"tcp4", "0.0.0.0"}, {"tcp6", "::"}} {
			lc := net.ListenConfig{Control: transparent}
			startListenerWith(t, n, p.Recorder, lc, l.network, net.JoinHostPort(l.host, strconv.Itoa(port)), port, reply)
		}
	}
	return p
}

func transparent(network, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		if network == "tcp6" {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
		} else {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
		}
	})
	if err != nil {
		return err
	}
	return serr
}

// StartUDPServer answers every datagram to addr ("host:port") inside n with reply; an empty
// host is both wildcards. A socket on a wildcard answers from the address its route picks, so
// a server whose clients must see the address they sent to (a connected socket takes nothing
// else) listens on that address. It stops at t's cleanup. Dial with a "udp" network talks to
// it.
func StartUDPServer(t testing.TB, n *NS, addr, reply string) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("StartUDPServer %q: %v", addr, err)
	}
	addrs := []string{addr}
	if host == "" {
		addrs = []string{net.JoinHostPort("0.0.0.0", port), net.JoinHostPort("::", port)}
	}
	for _, a := range addrs {
		network := "udp4"
		if strings.Contains(a, "[") {
			network = "udp6"
		}
		var pc net.PacketConn
		if err := n.Do(func() error {
			var err error
			pc, err = net.ListenPacket(network, a)
			return err
		}); err != nil {
			t.Fatalf("listen %s %s in %s: %v", network, a, n, err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			buf := make([]byte, 512)
			for {
				_, from, err := pc.ReadFrom(buf)
				if err != nil {
					return // closed at cleanup
				}
				_, _ = pc.WriteTo([]byte(reply+"\n"), from)
			}
		}()
		t.Cleanup(func() {
			_ = pc.Close()
			<-done
		})
	}
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
	startListenerWith(t, n, rec, net.ListenConfig{}, network, addr, port, reply)
}

func startListenerWith(t testing.TB, n *NS, rec *Recorder, lc net.ListenConfig, network, addr string, port int, reply string) {
	t.Helper()
	var ln net.Listener
	if err := n.Do(func() error {
		var err error
		ln, err = lc.Listen(context.Background(), network, addr)
		return err
	}); err != nil {
		t.Fatalf("listen %s %s in %s: %v", network, addr, n, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return // closed at cleanup
			}
			serve(c.(*net.TCPConn), rec, port, reply)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-done
	})
}

func serve(c *net.TCPConn, rec *Recorder, port int, reply string) {
	defer c.Close()
	conn := Conn{
		ListenPort: port,
		Local:      unmap(c.LocalAddr().(*net.TCPAddr).AddrPort()),
		Remote:     unmap(c.RemoteAddr().(*net.TCPAddr).AddrPort()),
	}
	if dst, err := origdst.Lookup(c); err == nil {
		conn.OriginalDst = dst
	}
	rec.add(conn)
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write([]byte(reply))
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// replyFrom trims a server reply for comparison.
func replyFrom(b []byte) string { return strings.TrimSpace(string(b)) }
