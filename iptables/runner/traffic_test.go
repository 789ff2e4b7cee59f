package runner_test

import (
	"context"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// trafficModes are the backends the real-traffic suite runs on.
var trafficModes = []iptables.Mode{iptables.ModeLegacy, iptables.ModeNFT, iptables.ModeNFTables, iptables.ModeAuto}

// execsNothing are the modes that must work with no program to run: the nft mode writes
// iptables-nft's rules over netlink, and so does auto here; the suite runs them with an empty
// PATH, where falling back to the iptables-nft binaries would fail.
var execsNothing = map[iptables.Mode]bool{iptables.ModeNFT: true, iptables.ModeNFTables: true, iptables.ModeAuto: true}

const (
	inboundProxy  = 4143
	outboundProxy = 4140
	proxyUID      = 2102
	proxyGID      = 2103
	appPort       = 8080 // a port the pod's app listens on
	otherAppPort  = 9090
	skipInPort    = 4190
	peerPort      = 80 // a port the peer's servers listen on
	skipOutPort   = 4567
)

func suiteConfig() iptables.Config {
	c := iptables.NewConfig()
	c.InboundProxyPort, c.OutboundProxyPort = inboundProxy, outboundProxy
	c.ProxyUID, c.ProxyGID = proxyUID, proxyGID
	c.InboundPortsToIgnore = []string{"4190,4191"}
	c.OutboundPortsToIgnore = []string{"4567"}
	c.InboundSubnetsToIgnore = []string{nt.PeerExtraNetIPv4A, nt.PeerExtraNetIPv6A}
	c.OutboundSubnetsToIgnore = []string{nt.PeerExtraNetIPv4B, nt.PeerExtraNetIPv6B}
	return c
}

// world is a pod with a fake proxy and app servers, and a peer with servers on every address.
type world struct {
	*nt.Pair
	proxy *nt.Proxy
	dns   *nt.Proxy // the DNS proxy's TCP listener, when started
	vm    *nt.NS    // the virtual machine behind the pod, when added
}

func newWorld(t *testing.T) *world { return newWorldWith(t, nt.StartProxy) }

// newWorldWith is newWorld with the proxy that startProxy starts.
func newWorldWith(t *testing.T, startProxy func(testing.TB, *nt.NS, ...int) *nt.Proxy) *world {
	nt.RequireRoot(t)
	w := &world{Pair: nt.NewPair(t)}
	w.proxy = startProxy(t, w.Pod, inboundProxy, outboundProxy)
	for _, port := range []int{appPort, otherAppPort, skipInPort} {
		nt.StartServer(t, w.Pod, nt.HostPort("", port))
	}
	for _, port := range []int{peerPort, skipOutPort} {
		nt.StartServer(t, w.Peer, nt.HostPort("", port))
	}
	return w
}

type family struct {
	name                            string
	pod, peer, peerSkipIn, peerSkip string
	loopback                        string
}

var families = []family{
	{"ipv4", nt.PodIPv4, nt.PeerIPv4, nt.PeerExtraIPv4A, nt.PeerExtraIPv4B, "127.0.0.1"},
	{"ipv6", nt.PodIPv6, nt.PeerIPv6, nt.PeerExtraIPv6A, nt.PeerExtraIPv6B, "::1"},
}

// expectProxy dials and checks that the fake proxy answered on port with the original
// destination preserved.
func (w *world) expectProxy(t *testing.T, from *nt.NS, addr string, port int, opts nt.DialOpts) {
	t.Helper()
	w.expectProxyOn(t, w.proxy, from, addr, port, opts)
}

// expectProxyOn is expectProxy for the listener p.
func (w *world) expectProxyOn(t *testing.T, p *nt.Proxy, from *nt.NS, addr string, port int, opts nt.DialOpts) {
	t.Helper()
	reply, err := nt.Dial(t, from, "tcp", addr, opts)
	if err != nil {
		t.Errorf("dial %s: %v", addr, err)
		return
	}
	if want := "proxy " + itoa(port); reply != want {
		t.Errorf("dial %s (uid %d gid %d): reply %q, want %q (redirect to %d)", addr, opts.UID, opts.GID, reply, want, port)
		return
	}
	c := p.Expect(t, 2*time.Second)
	if c.OriginalDst.String() != addr {
		t.Errorf("dial %s: proxy saw original destination %s", addr, c.OriginalDst)
	}
}

// expectDirect dials and checks that the real server answered: the proxy was bypassed.
func expectDirect(t *testing.T, from *nt.NS, addr string, opts nt.DialOpts) {
	t.Helper()
	reply, err := nt.Dial(t, from, "tcp", addr, opts)
	if err != nil {
		t.Errorf("dial %s: %v", addr, err)
		return
	}
	if !strings.HasPrefix(reply, "server ") {
		t.Errorf("dial %s (uid %d gid %d): reply %q, want a direct answer from the server", addr, opts.UID, opts.GID, reply)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }

func target(w *world, mode iptables.Mode) runner.Target {
	return runner.Target{NetNS: w.Pod.Path(), Options: runner.Options{Mode: mode, Wait: true}}
}

func apply(t *testing.T, w *world, mode iptables.Mode, c iptables.Config) runner.Outcome {
	t.Helper()
	c.Mode = mode
	rs, err := iptables.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	out, err := runner.Runner{}.Apply(context.Background(), target(w, mode), rs)
	if err != nil {
		t.Fatalf("apply (%s): %v", mode, err)
	}
	return out
}

func show(t *testing.T, w *world, mode iptables.Mode, c iptables.Config) iptables.State {
	t.Helper()
	rs, err := iptables.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	st, err := runner.Runner{}.Show(context.Background(), target(w, mode), rs)
	if err != nil {
		t.Fatalf("show (%s): %v", mode, err)
	}
	return st
}

func cleanup(t *testing.T, w *world, mode iptables.Mode) {
	t.Helper()
	if _, err := (runner.Runner{}).Cleanup(context.Background(), target(w, mode)); err != nil {
		t.Fatalf("cleanup (%s): %v", mode, err)
	}
}

// TestRealTraffic drives real TCP through the rules of every backend, for IPv4 and IPv6.
func TestRealTraffic(t *testing.T) {
	for _, mode := range trafficModes {
		t.Run(string(mode), func(t *testing.T) {
			w := newWorld(t)
			if execsNothing[mode] {
				t.Setenv("PATH", "")
			}
			cfg := suiteConfig()
			if res := apply(t, w, mode, cfg); !res.Changed {
				t.Error("first apply reported no change")
			}
			root := nt.DialOpts{UID: -1, GID: -1}
			for _, f := range families {
				t.Run(f.name, func(t *testing.T) {
					t.Run("outbound is redirected with its original destination", func(t *testing.T) {
						w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, root)
					})
					t.Run("inbound is redirected with its original destination", func(t *testing.T) {
						w.expectProxy(t, w.Peer, nt.HostPort(f.pod, appPort), inboundProxy, root)
					})
					t.Run("the proxy UID and GID are not redirected", func(t *testing.T) {
						expectDirect(t, w.Pod, nt.HostPort(f.peer, peerPort), nt.DialOpts{UID: proxyUID, GID: -1})
						expectDirect(t, w.Pod, nt.HostPort(f.peer, peerPort), nt.DialOpts{UID: -1, GID: proxyGID})
						// Another UID still is.
						w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, nt.DialOpts{UID: 2000, GID: 2000})
					})
					t.Run("skipped ports bypass the proxy", func(t *testing.T) {
						expectDirect(t, w.Peer, nt.HostPort(f.pod, skipInPort), root)
						expectDirect(t, w.Pod, nt.HostPort(f.peer, skipOutPort), root)
					})
					t.Run("skipped subnets bypass the proxy", func(t *testing.T) {
						src := nt.DialOpts{UID: -1, GID: -1, Source: mustAddr(f.peerSkipIn)}
						expectDirect(t, w.Peer, nt.HostPort(f.pod, appPort), src)
						expectDirect(t, w.Pod, nt.HostPort(f.peerSkip, peerPort), root)
						// The inbound source skip is not an outbound destination skip.
						w.expectProxy(t, w.Pod, nt.HostPort(f.peerSkipIn, peerPort), outboundProxy, root)
					})
					t.Run("loopback is not redirected", func(t *testing.T) {
						expectDirect(t, w.Pod, nt.HostPort(f.loopback, appPort), root)
						expectDirect(t, w.Pod, nt.HostPort(f.pod, appPort), root)
					})
				})
			}

			if res := apply(t, w, mode, cfg); res.Changed {
				t.Error("an identical re-run reported a change")
			}
			if st := show(t, w, mode, cfg); !st.Match() {
				t.Errorf("show after apply: %+v", st)
			} else if mode == iptables.ModeAuto && st.Backend != "iptables-nft" {
				t.Errorf("auto wrote with %s on a kernel that accepts iptables-nft's rules over netlink", st.Backend)
			}

			// A config change: redirect-listed mode, only appPort.
			listed := suiteConfig()
			listed.PortsToRedirect = []string{itoa(appPort)}
			apply(t, w, mode, listed)
			if st := show(t, w, mode, listed); !st.Match() {
				t.Errorf("after a config change, show: %+v", st)
			}
			for _, f := range families {
				w.expectProxy(t, w.Peer, nt.HostPort(f.pod, appPort), inboundProxy, root)
				expectDirect(t, w.Peer, nt.HostPort(f.pod, otherAppPort), root)
			}

			// Cleanup leaves nothing: show finds no rules, traffic flows directly.
			cleanup(t, w, mode)
			for _, fs := range show(t, w, mode, cfg).Families {
				if len(fs.Rules) != 0 {
					t.Errorf("after cleanup %s still has %q", fs.Family, fs.Rules)
				}
			}
			for _, f := range families {
				expectDirect(t, w.Pod, nt.HostPort(f.peer, peerPort), root)
				expectDirect(t, w.Peer, nt.HostPort(f.pod, appPort), root)
			}
		})
	}
}

// TestBackendSwitchLeavesOne applies with one backend and then another: only the second one's
// rules may remain, and traffic is still redirected.
func TestBackendSwitchLeavesOne(t *testing.T) {
	modes := []iptables.Mode{iptables.ModeLegacy, iptables.ModeNFT, iptables.ModeNFTables}
	for _, from := range modes {
		for _, to := range modes {
			if from == to {
				continue
			}
			t.Run(string(from)+"-to-"+string(to), func(t *testing.T) {
				w := newWorld(t)
				cfg := suiteConfig()
				apply(t, w, from, cfg)
				apply(t, w, to, cfg)
				for _, fs := range show(t, w, from, cfg).Families {
					if len(fs.Rules) != 0 {
						t.Errorf("%s rules survived the switch to %s: %q", from, to, fs.Rules)
					}
				}
				if st := show(t, w, to, cfg); !st.Match() {
					t.Errorf("%s rules after the switch: %+v", to, st)
				}
				w.expectProxy(t, w.Pod, nt.HostPort(nt.PeerIPv6, peerPort), outboundProxy, nt.DialOpts{UID: -1, GID: -1})
			})
		}
	}
}
