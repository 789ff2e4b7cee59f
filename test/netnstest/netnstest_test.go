package netnstest

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const expectWait = 2 * time.Second

func TestNewNSIsFreshAndCleanedUp(t *testing.T) {
	RequireRoot(t)
	var paths []string
	t.Run("inner", func(t *testing.T) {
		a, b := NewNS(t), NewNS(t)
		paths = []string{a.Path(), b.Path()}
		if inode(t, a.Path()) == inode(t, b.Path()) {
			t.Fatalf("two NewNS calls returned the same namespace")
		}
		// lo is up: a loopback server answers, over both families.
		StartServer(t, a, ":80")
		for _, addr := range []string{"127.0.0.1:80", "[::1]:80"} {
			reply, err := Dial(t, a, "tcp", addr, DialOpts{})
			if err != nil || reply != "server :80" {
				t.Fatalf("Dial %s = %q, %v; want server :80", addr, reply, err)
			}
		}
		// ...and the namespace is isolated: the same server is not in b.
		if reply, err := Dial(t, b, "tcp", "127.0.0.1:80", DialOpts{Timeout: time.Second}); err == nil {
			t.Fatalf("Dial in the other namespace got %q, want an error", reply)
		}
		out, err := RunIn(t, a, "ip", "-o", "link", "show")
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(out, "eth0") || !strings.Contains(out, "lo:") {
			t.Fatalf("fresh namespace links:\n%s\nwant only lo", out)
		}
	})
	for _, p := range paths {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("namespace %s still exists after cleanup (stat err %v)", p, err)
		}
	}
}

// NewUserNS's namespace belongs to a user namespace of its own, which maps root to
// UserNSHostRoot, and is gone after the test.
func TestNewUserNSIsOwnedAndCleanedUp(t *testing.T) {
	RequireRoot(t)
	var path string
	t.Run("inner", func(t *testing.T) {
		n := NewUserNS(t)
		path = n.Path()
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		fd, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_USERNS)
		if err != nil {
			t.Fatalf("NS_GET_USERNS: %v", err)
		}
		owner := os.NewFile(uintptr(fd), "owner")
		defer owner.Close()
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			t.Fatal(err)
		}
		if st.Ino == inode(t, "/proc/self/ns/user") {
			t.Fatalf("the namespace is owned by our own user namespace")
		}
		// A process that joins the owner finds root mapped to UserNSHostRoot.
		if _, err := exec.LookPath("nsenter"); err == nil {
			user := fmt.Sprintf("--user=/proc/%d/fd/%d", os.Getpid(), fd)
			out, err := RunIn(t, n, "nsenter", user, "cat", "/proc/self/uid_map")
			if err != nil {
				t.Fatal(err)
			}
			if f := strings.Fields(out); len(f) != 3 || f[0] != "0" || f[1] != fmt.Sprint(UserNSHostRoot) || f[2] != "65536" {
				t.Fatalf("uid_map in the owner: %q", out)
			}
		}
		// lo is up.
		StartServer(t, n, ":80")
		if reply, err := Dial(t, n, "tcp", "127.0.0.1:80", DialOpts{}); err != nil || reply != "server :80" {
			t.Fatalf("Dial = %q, %v", reply, err)
		}
	})
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("namespace %s still exists after cleanup (stat err %v)", path, err)
	}
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

// TestPairDirect checks the plain wiring, without any rule: every peer
// address is reachable from the pod, the peer reaches the pod from every
// source, and nothing reports an original destination.
func TestPairDirect(t *testing.T) {
	RequireRoot(t)
	p := NewPair(t)
	peerSrv := StartServer(t, p.Peer, ":80")
	podSrv := StartServer(t, p.Pod, ":8080")

	tests := []struct {
		name       string
		from       *NS
		srv        *Server
		source     string // "" = kernel's choice
		dst        string
		port       int
		opts       DialOpts
		wantRemote string
	}{
		{name: "pod to peer v4", from: p.Pod, srv: peerSrv, dst: PeerIPv4, port: 80, wantRemote: PodIPv4},
		{name: "pod to peer v6", from: p.Pod, srv: peerSrv, dst: PeerIPv6, port: 80, wantRemote: PodIPv6},
		{name: "pod to extra v4 A", from: p.Pod, srv: peerSrv, dst: PeerExtraIPv4A, port: 80, wantRemote: PodIPv4},
		{name: "pod to extra v4 B", from: p.Pod, srv: peerSrv, dst: PeerExtraIPv4B, port: 80, wantRemote: PodIPv4},
		{name: "pod to extra v6 A", from: p.Pod, srv: peerSrv, dst: PeerExtraIPv6A, port: 80, wantRemote: PodIPv6},
		{name: "pod to extra v6 B", from: p.Pod, srv: peerSrv, dst: PeerExtraIPv6B, port: 80, wantRemote: PodIPv6},
		{name: "pod to peer as uid 2102", from: p.Pod, srv: peerSrv, dst: PeerIPv4, port: 80, opts: DialOpts{UID: 2102, GID: 2102}, wantRemote: PodIPv4},
		{name: "peer to pod v4", from: p.Peer, srv: podSrv, dst: PodIPv4, port: 8080, wantRemote: PeerIPv4},
		{name: "peer to pod v6", from: p.Peer, srv: podSrv, dst: PodIPv6, port: 8080, wantRemote: PeerIPv6},
		{name: "peer to pod from extra v4", from: p.Peer, srv: podSrv, source: PeerExtraIPv4B, dst: PodIPv4, port: 8080, wantRemote: PeerExtraIPv4B},
		{name: "peer to pod from extra v6", from: p.Peer, srv: podSrv, source: PeerExtraIPv6A, dst: PodIPv6, port: 8080, wantRemote: PeerExtraIPv6A},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			if tc.source != "" {
				opts.Source = netip.MustParseAddr(tc.source)
			}
			reply, err := Dial(t, tc.from, "tcp", HostPort(tc.dst, tc.port), opts)
			if err != nil {
				t.Fatal(err)
			}
			if want := "server " + tc.srv.Addr; reply != want {
				t.Fatalf("reply %q, want %q", reply, want)
			}
			c := tc.srv.Expect(t, expectWait)
			if c.Local != AddrPort(tc.dst, tc.port) || c.Remote.Addr() != netip.MustParseAddr(tc.wantRemote) || c.ListenPort != tc.port {
				t.Fatalf("recorded %v, want %s -> %s", c, tc.wantRemote, HostPort(tc.dst, tc.port))
			}
			if c.OriginalDst.IsValid() || c.Redirected() {
				t.Fatalf("recorded original dst %v without any nat rule", c.OriginalDst)
			}
		})
	}
}

// TestDialCredentialsStayOnTheirThread checks that a Dial as another user
// leaves no thread of the test binary with that identity behind.
func TestDialCredentialsStayOnTheirThread(t *testing.T) {
	RequireRoot(t)
	p := NewPair(t)
	StartServer(t, p.Peer, ":80")
	for i := 0; i < 10; i++ {
		if _, err := Dial(t, p.Pod, "tcp", HostPort(PeerIPv4, 80), DialOpts{UID: 2102, GID: 2102}); err != nil {
			t.Fatal(err)
		}
	}
	if os.Getuid() != 0 || os.Getgid() != 0 {
		t.Fatalf("process identity changed: uid %d gid %d", os.Getuid(), os.Getgid())
	}
	// The tainted threads exit right after their goroutine; poll briefly.
	deadline := time.Now().Add(5 * time.Second)
	for {
		tainted := taintedThreads(t)
		if len(tainted) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("threads still running as non-root: %v", tainted)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func taintedThreads(t *testing.T) []string {
	t.Helper()
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil {
		t.Fatal(err)
	}
	var tainted []string
	for _, f := range tasks {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // thread exited meanwhile
		}
		for _, line := range strings.Split(string(b), "\n") {
			if (strings.HasPrefix(line, "Uid:") || strings.HasPrefix(line, "Gid:")) && strings.Contains(line, "2102") {
				tainted = append(tainted, f+": "+line)
			}
		}
	}
	return tainted
}

// redirectNft is the native nftables equivalent of the iptables rules in
// TestRedirect, to show the harness observes either kind of NAT.
const redirectNft = `table inet netnstest {
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		meta l4proto tcp redirect to :4143
	}
	chain output {
		type nat hook output priority -100; policy accept;
		meta l4proto tcp meta skuid 2102 return
		meta l4proto tcp meta skgid 2200 return
		oifname "lo" return
		meta l4proto tcp redirect to :4140
	}
}
`

// TestRedirect proves the harness can observe redirection: with hand-written
// rules in the pod (iptables-legacy, iptables-nft, native nft), outbound lands
// on the fake proxy's 4140 and inbound on 4143, each with the right original
// destination, and owner matches exempt the proxy's UID and a GID.
func TestRedirect(t *testing.T) {
	RequireRoot(t)
	iptablesRules := [][]string{
		{"-A", "PREROUTING", "-p", "tcp", "-j", "REDIRECT", "--to-ports", "4143"},
		{"-A", "OUTPUT", "-p", "tcp", "-m", "owner", "--uid-owner", "2102", "-j", "RETURN"},
		{"-A", "OUTPUT", "-p", "tcp", "-m", "owner", "--gid-owner", "2200", "-j", "RETURN"},
		{"-A", "OUTPUT", "-p", "tcp", "!", "-o", "lo", "-j", "REDIRECT", "--to-ports", "4140"},
	}
	iptables := func(v4, v6, save string) func(t *testing.T, pod *NS) {
		return func(t *testing.T, pod *NS) {
			for _, bin := range []string{v4, v6} {
				for _, rule := range iptablesRules {
					if _, err := RunIn(t, pod, bin, append([]string{"-w", "-t", "nat"}, rule...)...); err != nil {
						t.Fatal(err)
					}
				}
			}
			out, err := RunIn(t, pod, save, "-t", "nat")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "--uid-owner 2102 -j RETURN") {
				t.Fatalf("%s in the pod lacks the owner rule:\n%s", save, out)
			}
		}
	}
	backends := []struct {
		name  string
		apply func(t *testing.T, pod *NS)
	}{
		{"iptables-legacy", iptables("iptables-legacy", "ip6tables-legacy", "ip6tables-legacy-save")},
		{"iptables-nft", iptables("iptables-nft", "ip6tables-nft", "ip6tables-nft-save")},
		{"nft", func(t *testing.T, pod *NS) {
			if _, err := RunInWithInput(t, pod, redirectNft, "nft", "-f", "-"); err != nil {
				t.Fatal(err)
			}
			out, err := RunIn(t, pod, "nft", "list", "ruleset")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(out, "skuid 2102") {
				t.Fatalf("nft ruleset in the pod lacks the owner rule:\n%s", out)
			}
		}},
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			p := NewPair(t)
			proxy := StartProxy(t, p.Pod, 4140, 4143)
			peerSrv := StartServer(t, p.Peer, ":80")
			appSrv := StartServer(t, p.Pod, ":8080")
			b.apply(t, p.Pod)
			checkRedirect(t, p, proxy, peerSrv, appSrv)
		})
	}
}

func checkRedirect(t *testing.T, p *Pair, proxy *Proxy, peerSrv, appSrv *Server) {
	tests := []struct {
		name      string
		from      *NS
		source    string
		dst       string
		port      int
		opts      DialOpts
		wantReply string
		// for redirected connections: the proxy's record
		wantListen int
		wantRemote string
	}{
		{name: "outbound v4", from: p.Pod, dst: PeerIPv4, port: 80, wantReply: "proxy 4140", wantListen: 4140},
		{name: "outbound v6", from: p.Pod, dst: PeerIPv6, port: 80, wantReply: "proxy 4140", wantListen: 4140},
		{name: "outbound extra v4", from: p.Pod, dst: PeerExtraIPv4A, port: 443, wantReply: "proxy 4140", wantListen: 4140},
		{name: "outbound unassigned v4", from: p.Pod, dst: "203.0.113.99", port: 5432, wantReply: "proxy 4140", wantListen: 4140},
		{name: "outbound extra v6", from: p.Pod, dst: PeerExtraIPv6B, port: 443, wantReply: "proxy 4140", wantListen: 4140},
		{name: "outbound other uid", from: p.Pod, dst: PeerIPv4, port: 80, opts: DialOpts{UID: 2103}, wantReply: "proxy 4140", wantListen: 4140},
		{name: "proxy uid exempt v4", from: p.Pod, dst: PeerIPv4, port: 80, opts: DialOpts{UID: 2102}, wantReply: "server :80"},
		{name: "proxy uid exempt v6", from: p.Pod, dst: PeerIPv6, port: 80, opts: DialOpts{UID: 2102}, wantReply: "server :80"},
		{name: "gid exempt", from: p.Pod, dst: PeerExtraIPv6A, port: 80, opts: DialOpts{UID: 3000, GID: 2200}, wantReply: "server :80"},
		{name: "inbound v4", from: p.Peer, dst: PodIPv4, port: 8080, wantReply: "proxy 4143", wantListen: 4143, wantRemote: PeerIPv4},
		{name: "inbound v6", from: p.Peer, dst: PodIPv6, port: 8080, wantReply: "proxy 4143", wantListen: 4143, wantRemote: PeerIPv6},
		{name: "inbound from extra v4", from: p.Peer, source: PeerExtraIPv4A, dst: PodIPv4, port: 8080, wantReply: "proxy 4143", wantListen: 4143, wantRemote: PeerExtraIPv4A},
		{name: "inbound from extra v6", from: p.Peer, source: PeerExtraIPv6B, dst: PodIPv6, port: 8080, wantReply: "proxy 4143", wantListen: 4143, wantRemote: PeerExtraIPv6B},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			if tc.source != "" {
				opts.Source = netip.MustParseAddr(tc.source)
			}
			proxyBefore, appBefore := len(proxy.Conns()), len(appSrv.Conns())
			reply, err := Dial(t, tc.from, "tcp", HostPort(tc.dst, tc.port), opts)
			if err != nil {
				t.Fatal(err)
			}
			if reply != tc.wantReply {
				t.Fatalf("reply %q, want %q", reply, tc.wantReply)
			}
			if tc.wantListen == 0 {
				// Replies are sent after recording, so the proxy would
				// already show the connection had it been redirected.
				if n := len(proxy.Conns()); n != proxyBefore {
					t.Fatalf("proxy recorded %d new connections for an exempt dial", n-proxyBefore)
				}
				c := peerSrv.Expect(t, expectWait)
				if c.Local != AddrPort(tc.dst, tc.port) {
					t.Fatalf("peer server saw %v, want local %s", c, HostPort(tc.dst, tc.port))
				}
				return
			}
			c := proxy.Expect(t, expectWait)
			if c.ListenPort != tc.wantListen {
				t.Fatalf("landed on %d, want %d (%v)", c.ListenPort, tc.wantListen, c)
			}
			if want := AddrPort(tc.dst, tc.port); c.OriginalDst != want || !c.Redirected() {
				t.Fatalf("original dst %v, want %v (%v)", c.OriginalDst, want, c)
			}
			if tc.wantRemote != "" && c.Remote.Addr() != netip.MustParseAddr(tc.wantRemote) {
				t.Fatalf("remote %v, want %s", c.Remote, tc.wantRemote)
			}
			if n := len(appSrv.Conns()); n != appBefore {
				t.Fatalf("the app server got %d connections past the redirect", n-appBefore)
			}
		})
	}
}
