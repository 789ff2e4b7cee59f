package nfnl_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/nfnl"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// A quick real-traffic check of the native backend's redirect semantics; the shared suite in
// iptables/runner covers every case for every backend.
func TestRealTraffic(t *testing.T) {
	nt.RequireRoot(t)
	const inPort, outPort, uid, appPort, peerPort = 4143, 4140, 2102, 8080, 80
	w := nt.NewPair(t)
	proxy := nt.StartProxy(t, w.Pod, inPort, outPort)
	nt.StartServer(t, w.Pod, nt.HostPort("", appPort))
	nt.StartServer(t, w.Peer, nt.HostPort("", peerPort))

	apply := func(t *testing.T, ipv6 bool) {
		t.Helper()
		c := iptables.NewConfig()
		c.InboundProxyPort, c.OutboundProxyPort, c.ProxyUID, c.IPv6 = inPort, outPort, uid, ipv6
		c.OutboundSubnetsToIgnore = []string{nt.PeerExtraNetIPv4B, nt.PeerExtraNetIPv6B}
		rs, err := iptables.Build(c)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Pod.Do(func() error {
			_, err := nfnl.New(iptables.BackendNFTables, iptables.BackendNFT).Apply(context.Background(), rs)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	root := nt.DialOpts{UID: -1, GID: -1}
	expectProxy := func(t *testing.T, from *nt.NS, addr string, port int, opts nt.DialOpts) {
		t.Helper()
		reply, err := nt.Dial(t, from, "tcp", addr, opts)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		if want := "proxy " + strconv.Itoa(port); reply != want {
			t.Fatalf("dial %s: reply %q, want %q", addr, reply, want)
		}
		if c := proxy.Expect(t, 2*time.Second); c.OriginalDst.String() != addr {
			t.Errorf("dial %s: proxy saw original destination %s", addr, c.OriginalDst)
		}
	}
	expectDirect := func(t *testing.T, from *nt.NS, addr string, opts nt.DialOpts) {
		t.Helper()
		reply, err := nt.Dial(t, from, "tcp", addr, opts)
		if err != nil {
			t.Fatalf("dial %s: %v", addr, err)
		}
		if !strings.HasPrefix(reply, "server ") {
			t.Errorf("dial %s (uid %d): reply %q, want the server itself", addr, opts.UID, reply)
		}
	}

	apply(t, true)
	for _, f := range []struct{ name, pod, peer, skipped, loopback string }{
		{"ipv4", nt.PodIPv4, nt.PeerIPv4, nt.PeerExtraIPv4B, "127.0.0.1"},
		{"ipv6", nt.PodIPv6, nt.PeerIPv6, nt.PeerExtraIPv6B, "::1"},
	} {
		t.Run(f.name, func(t *testing.T) {
			expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outPort, root)
			expectProxy(t, w.Peer, nt.HostPort(f.pod, appPort), inPort, root)
			expectDirect(t, w.Pod, nt.HostPort(f.peer, peerPort), nt.DialOpts{UID: uid, GID: -1})
			expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outPort, nt.DialOpts{UID: 2000, GID: 2000})
			expectDirect(t, w.Pod, nt.HostPort(f.skipped, peerPort), root)
			expectDirect(t, w.Pod, nt.HostPort(f.loopback, appPort), root)
		})
	}

	// IPv6 off: IPv4 is still redirected, IPv6 is left alone in both directions.
	t.Run("ipv6 off", func(t *testing.T) {
		apply(t, false)
		expectProxy(t, w.Pod, nt.HostPort(nt.PeerIPv4, peerPort), outPort, root)
		expectDirect(t, w.Pod, nt.HostPort(nt.PeerIPv6, peerPort), root)
		expectDirect(t, w.Peer, nt.HostPort(nt.PodIPv6, appPort), root)
		expectProxy(t, w.Peer, nt.HostPort(nt.PodIPv4, appPort), inPort, root)
	})
}
