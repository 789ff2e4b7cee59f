package runner_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

const (
	dnsProxyPort  = 5353 // where --redirect-dns-to-port sends the pod's DNS
	peerOtherPort = 9000 // a peer port no include list names
	holdPort      = 4243 // the inbound port of the drop-invalid case, whose proxy holds connections
	// The second link of the interface case, a secondary network beside eth0.
	net1       = "net1"
	podNet1v4  = "203.0.113.129"
	peerNet1v4 = "203.0.113.130"
	podNet1v6  = "2001:db8:5::10"
	peerNet1v6 = "2001:db8:5::20"
	// The pod's end of the link to its virtual machine, as KubeVirt names a VM's tap.
	vmTap = "tap0"
)

// featureCase is one feature beyond Linkerd's, checked with real traffic after an apply, before
// the cleanup that must leave nothing behind.
type featureCase struct {
	name   string
	config func() iptables.Config
	// setup adds what the case needs to the world before the rules go in.
	setup func(t *testing.T, w *world)
	check func(t *testing.T, w *world)
	// transparent starts the proxy's listeners with IP_TRANSPARENT, as TPROXY needs.
	transparent bool
}

var root = nt.DialOpts{UID: -1, GID: -1}

// featureCases are the features of the list, each on its own.
var featureCases = []featureCase{
	{
		name: "dns capture",
		config: func() iptables.Config {
			c := suiteConfig()
			c.RedirectDNSToPort = dnsProxyPort
			return c
		},
		setup: startDNS,
		check: func(t *testing.T, w *world) {
			for _, f := range families {
				ns := nt.HostPort(f.peer, 53)
				expectDNS(t, w, ns, root, true, tcpDNSProxy)
				expectDNS(t, w, nt.HostPort(f.peerSkip, 53), root, true, tcpDNSProxy)
				// The proxy's own queries, by its UID or its GID, go to the nameserver.
				expectDNS(t, w, ns, nt.DialOpts{UID: proxyUID, GID: -1}, false, tcpNameserver)
				expectDNS(t, w, ns, nt.DialOpts{UID: -1, GID: proxyGID}, false, tcpNameserver)
				// And TCP that is not DNS is still the outbound proxy's.
				w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, root)
			}
		},
	},
	{
		name: "dns capture of the listed nameservers only",
		config: func() iptables.Config {
			c := suiteConfig()
			c.RedirectDNSToPort, c.DNSServersOnly = dnsProxyPort, true
			c.DNSServers = []string{nt.PeerIPv4, nt.PeerIPv6}
			return c
		},
		setup: startDNS,
		check: func(t *testing.T, w *world) {
			for _, f := range families {
				expectDNS(t, w, nt.HostPort(f.peer, 53), root, true, tcpDNSProxy)
				expectDNS(t, w, nt.HostPort(f.peerSkipIn, 53), root, false, tcpOutbound)
			}
		},
	},
	{
		name: "tproxy inbound",
		config: func() iptables.Config {
			c := suiteConfig()
			c.InboundMode = iptables.InboundTPROXY
			return c
		},
		transparent: true,
		check: func(t *testing.T, w *world) {
			routes := policyRouting(t, w.Pod)
			if len(routes) != 4 {
				t.Errorf("policy routing in place: %q, want an ip rule and a route per family", routes)
			}
			for _, f := range families {
				peer := mustAddr(f.peer)
				reply, err := nt.Dial(t, w.Peer, "tcp", nt.HostPort(f.pod, appPort), root)
				if err != nil || reply != "proxy "+itoa(inboundProxy) {
					t.Errorf("inbound to %s: %q, %v; want the transparent proxy's answer", nt.HostPort(f.pod, appPort), reply, err)
					continue
				}
				c := w.proxy.Expect(t, 2*time.Second)
				// TPROXY changes no address: the socket's local address is the original
				// destination, its remote one the peer's own.
				if c.Local != nt.AddrPort(f.pod, appPort) || c.Remote.Addr() != peer {
					t.Errorf("the transparent proxy saw %s, want %s -> %s", c, peer, nt.HostPort(f.pod, appPort))
				}
				expectDirect(t, w.Peer, nt.HostPort(f.pod, skipInPort), root)
				expectDirect(t, w.Pod, nt.HostPort(f.loopback, appPort), root)
				w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, root)
			}
		},
	},
	{
		name: "outbound include lists",
		config: func() iptables.Config {
			c := suiteConfig()
			c.OutboundPortsToRedirect = []string{itoa(peerPort)}
			c.OutboundSubnetsToRedirect = []string{nt.LinkNetIPv4, nt.LinkNetIPv6}
			return c
		},
		setup: func(t *testing.T, w *world) { nt.StartServer(t, w.Peer, nt.HostPort("", peerOtherPort)) },
		check: func(t *testing.T, w *world) {
			for _, f := range families {
				w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, root)
				// A port the list does not name, a destination it does not name.
				expectDirect(t, w.Pod, nt.HostPort(f.peer, peerOtherPort), root)
				expectDirect(t, w.Pod, nt.HostPort(f.peerSkipIn, peerPort), root)
				// Inbound is untouched by them.
				w.expectProxy(t, w.Peer, nt.HostPort(f.pod, appPort), inboundProxy, root)
			}
		},
	},
	{
		name: "outbound port include list alone",
		config: func() iptables.Config {
			c := suiteConfig()
			c.OutboundPortsToRedirect = []string{itoa(peerPort)}
			return c
		},
		setup: func(t *testing.T, w *world) { nt.StartServer(t, w.Peer, nt.HostPort("", peerOtherPort)) },
		check: func(t *testing.T, w *world) {
			for _, f := range families {
				w.expectProxy(t, w.Pod, nt.HostPort(f.peerSkipIn, peerPort), outboundProxy, root)
				expectDirect(t, w.Pod, nt.HostPort(f.peer, peerOtherPort), root)
				// The ignore lists still win.
				expectDirect(t, w.Pod, nt.HostPort(f.peerSkip, peerPort), root)
			}
		},
	},
	{
		name:   "interfaces to ignore",
		config: func() iptables.Config { return net1Config(true) },
		setup:  addNet1,
		check: func(t *testing.T, w *world) {
			for _, a := range []struct{ pod, peer string }{{podNet1v4, peerNet1v4}, {podNet1v6, peerNet1v6}} {
				expectDirect(t, w.Pod, nt.HostPort(a.peer, peerPort), root)
				expectDirect(t, w.Peer, nt.HostPort(a.pod, appPort), root)
			}
			// eth0 is still redirected.
			for _, f := range families {
				w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, root)
				w.expectProxy(t, w.Peer, nt.HostPort(f.pod, appPort), inboundProxy, root)
			}
		},
	},
	{
		// The control of the case above: without the exclusion, net1 is redirected as eth0 is.
		name:   "second interface without the exclusion",
		config: func() iptables.Config { return net1Config(false) },
		setup:  addNet1,
		check: func(t *testing.T, w *world) {
			for _, a := range []struct{ pod, peer string }{{podNet1v4, peerNet1v4}, {podNet1v6, peerNet1v6}} {
				w.expectProxy(t, w.Pod, nt.HostPort(a.peer, peerPort), outboundProxy, root)
				w.expectProxy(t, w.Peer, nt.HostPort(a.pod, appPort), inboundProxy, root)
			}
		},
	},
	{
		name: "virtual machine interfaces rerouted",
		config: func() iptables.Config {
			c := suiteConfig()
			c.RerouteVirtualInterfaces = []string{vmTap}
			return c
		},
		setup: addVM,
		check: func(t *testing.T, w *world) { expectVM(t, w, outboundProxy) },
	},
	{
		name: "virtual machine interfaces rerouted, inbound by tproxy",
		config: func() iptables.Config {
			c := suiteConfig()
			c.RerouteVirtualInterfaces, c.InboundMode = []string{vmTap}, iptables.InboundTPROXY
			return c
		},
		transparent: true,
		setup:       addVM,
		check: func(t *testing.T, w *world) {
			expectVM(t, w, outboundProxy)
			for _, f := range families {
				if reply, err := nt.Dial(t, w.Peer, "tcp", nt.HostPort(f.pod, appPort), root); err != nil || reply != "proxy "+itoa(inboundProxy) {
					t.Errorf("inbound to %s: %q, %v; want the transparent proxy's answer", nt.HostPort(f.pod, appPort), reply, err)
				} else if c := w.proxy.Expect(t, 2*time.Second); c.Local != nt.AddrPort(f.pod, appPort) {
					t.Errorf("the transparent proxy saw %s, want a connection to %s", c, nt.HostPort(f.pod, appPort))
				}
			}
		},
	},
	{
		// The control of the cases above, and the problem they solve: without rerouting, the
		// VM's outbound TCP, arriving on an interface of the pod, is taken for inbound.
		name:   "virtual machine without rerouting",
		config: suiteConfig,
		setup:  addVM,
		check:  func(t *testing.T, w *world) { expectVM(t, w, inboundProxy) },
	},
	{
		name: "uids and gids to ignore",
		config: func() iptables.Config {
			c := suiteConfig()
			c.UIDsToIgnore = []string{"1000,1001"}
			c.GIDsToIgnore = []string{"3000"}
			return c
		},
		check: func(t *testing.T, w *world) {
			for _, f := range families {
				dst := nt.HostPort(f.peer, peerPort)
				for _, o := range []nt.DialOpts{{UID: 1000, GID: 2000}, {UID: 1001, GID: 2000}, {UID: 2000, GID: 3000}, {UID: proxyUID, GID: -1}} {
					expectDirect(t, w.Pod, dst, o)
				}
				w.expectProxy(t, w.Pod, dst, outboundProxy, nt.DialOpts{UID: 1002, GID: 2000})
			}
		},
	},
	{
		name: "drop invalid",
		config: func() iptables.Config {
			c := suiteConfig()
			c.InboundProxyPort, c.DropInvalid = holdPort, true
			return c
		},
		setup: func(t *testing.T, w *world) { startHolder(t, w.Pod) },
		check: func(t *testing.T, w *world) { expectOutOfWindow(t, w, false) },
	},
	{
		// The control of the case above: without --drop-invalid the segment reaches the app's
		// port unredirected, and the pod's kernel answers it with a reset.
		name: "invalid without drop-invalid",
		config: func() iptables.Config {
			c := suiteConfig()
			c.InboundProxyPort = holdPort
			return c
		},
		setup: func(t *testing.T, w *world) { startHolder(t, w.Pod) },
		check: func(t *testing.T, w *world) { expectOutOfWindow(t, w, true) },
	},
}

// TestFeatureTraffic drives real traffic through the rules of each feature beyond Linkerd's, in
// every backend; show must match after the apply, and cleanup must leave nothing in any table
// and no policy routing.
func TestFeatureTraffic(t *testing.T) {
	for _, mode := range writerModes {
		t.Run(string(mode), func(t *testing.T) {
			if execsNothing[mode] {
				t.Setenv("PATH", "")
			}
			for _, tc := range featureCases {
				t.Run(tc.name, func(t *testing.T) {
					start := nt.StartProxy
					if tc.transparent {
						start = nt.StartTransparentProxy
					}
					w := newWorldWith(t, start)
					if tc.setup != nil {
						tc.setup(t, w)
					}
					cfg := tc.config()
					apply(t, w, mode, cfg)
					if st := show(t, w, mode, cfg); !st.Match() {
						t.Errorf("show after apply: %+v", st)
					}
					inspect(t, w, mode, cfg)
					if res := apply(t, w, mode, cfg); res.Changed {
						t.Error("an identical re-run reported a change")
					}
					tc.check(t, w)
					cleanup(t, w, mode)
					if left := residue(t, w.Pod); left != "" {
						t.Errorf("left after cleanup:\n%s", left)
					}
				})
			}
		})
	}
}

// inspect checks what show without rule flags makes of the rules in place: the configuration
// that wrote them (the same plan), whole, in the backend that holds them.
func inspect(t *testing.T, w *world, mode iptables.Mode, c iptables.Config) {
	t.Helper()
	in, err := runner.Runner{}.Read(context.Background(), target(w, mode))
	if err != nil {
		t.Fatalf("read the rules in place: %v", err)
	}
	f := iptables.Inspect(in)
	if want := iptablestest.Build(t, c); !f.Whole() || f.Rules.Hash() != want.Hash() {
		t.Errorf("show without rule flags: whole %t, problems %q, read back %v; want %v", f.Whole(), f.Problems, f.Rules.Args(), want.Args())
	}
}

// TestEveryFeatureSwitchesBackends applies every feature at once in one backend and then in
// another: the first one's rules in every table go, the policy routing stays, show matches, and
// cleanup leaves nothing.
func TestEveryFeatureSwitchesBackends(t *testing.T) {
	for i, from := range writerModes {
		to := writerModes[(i+1)%len(writerModes)]
		t.Run(string(from)+"-to-"+string(to), func(t *testing.T) {
			w := newWorld(t)
			cfg := suiteConfig()
			cfg.RedirectDNSToPort, cfg.InboundMode, cfg.DropInvalid = dnsProxyPort, iptables.InboundTPROXY, true
			cfg.OutboundPortsToRedirect, cfg.InterfacesToIgnore = []string{itoa(peerPort)}, []string{net1}
			cfg.UIDsToIgnore, cfg.GIDsToIgnore = []string{"1000"}, []string{"3000"}
			cfg.RerouteVirtualInterfaces = []string{vmTap}
			apply(t, w, from, cfg)
			// Before the switch, show in the other backend names every table of ours the first
			// one holds (what CHECK and show report as rules elsewhere).
			var elsewhere []string
			for _, e := range show(t, w, to, cfg).Elsewhere {
				elsewhere = append(elsewhere, e.Rules...)
			}
			want := []string{"PROXY_INIT_MANGLE_PREROUTING", "PROXY_INIT_RAW_OUTPUT", "PROXY_INIT_OUTPUT"}
			if from == iptables.ModeNFTables {
				want = []string{"proxy_init"}
			}
			for _, s := range want {
				if !strings.Contains(strings.Join(elsewhere, "\n"), s) {
					t.Errorf("show in %s does not report %s's %s: %q", to, from, s, elsewhere)
				}
			}
			apply(t, w, to, cfg)
			st := show(t, w, to, cfg)
			if !st.Match() || len(st.Elsewhere) != 0 {
				t.Errorf("after the switch: %+v", st)
			}
			if st.Routes == nil || len(st.Routes.Lines) != 4 {
				t.Errorf("show's policy routing: %+v", st.Routes)
			}
			for _, fs := range show(t, w, from, cfg).Families {
				if len(fs.Rules) != 0 {
					t.Errorf("%s rules survived the switch to %s: %q", from, to, fs.Rules)
				}
			}
			// What residue looks for is there before the cleanup: the check below can see it.
			before := residue(t, w.Pod)
			for _, s := range []string{"proxy-init/drop-invalid", "proxy-init/dns-zone-captured", "proxy-init/tproxy-all-incoming", "rule family", "route family"} {
				if !strings.Contains(before, s) {
					t.Errorf("residue before cleanup lacks %q:\n%s", s, before)
				}
			}
			cleanup(t, w, to)
			if left := residue(t, w.Pod); left != "" {
				t.Errorf("left after cleanup:\n%s", left)
			}
		})
	}
}

// TestIPv6Auto: under ipv6=auto a namespace with no IPv6 address beyond loopback and link-local
// gets IPv4 rules only, and one with a global IPv6 address gets both, and the log says which.
func TestIPv6Auto(t *testing.T) {
	for _, mode := range writerModes {
		for _, v4only := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/v4-only=%v", mode, v4only), func(t *testing.T) {
				w := newWorld(t)
				if v4only {
					removeAddr(t, w.Pod, nt.IfName, nt.PodIPv6+"/64")
				}
				cfg := suiteConfig()
				cfg.IPv6Auto, cfg.Mode = true, mode
				rs, err := iptables.Build(cfg)
				if err != nil {
					t.Fatal(err)
				}
				var logs bytes.Buffer
				tg := target(w, mode)
				tg.Log = slog.New(slog.NewTextHandler(&logs, nil))
				if _, err := (runner.Runner{}).Apply(context.Background(), tg, rs); err != nil {
					t.Fatal(err)
				}
				want := "ipv6=auto: writing IPv6 rules"
				if v4only {
					want = "ipv6=auto: writing no IPv6 rules"
				}
				if !strings.Contains(logs.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, logs.String())
				}
				// What is in place is exactly the rules of the family the namespace has.
				var with, without iptables.State
				if err := w.Pod.Do(func() error {
					a, _, err := runner.New(runner.Options{Mode: mode})
					if err != nil {
						return err
					}
					if with, err = a.Show(context.Background(), rs.ForIPv6(true)); err != nil {
						return err
					}
					without, err = a.Show(context.Background(), rs.ForIPv6(false))
					return err
				}); err != nil {
					t.Fatal(err)
				}
				if with.Match() == v4only || without.Match() != v4only {
					t.Errorf("v4-only %v: rules match with IPv6 %v, without %v", v4only, with.Match(), without.Match())
				}
				if st := show(t, w, mode, cfg); !st.Match() {
					t.Errorf("show under auto: %+v", st)
				}
				w.expectProxy(t, w.Pod, nt.HostPort(nt.PeerIPv4, peerPort), outboundProxy, root)
				if !v4only {
					w.expectProxy(t, w.Pod, nt.HostPort(nt.PeerIPv6, peerPort), outboundProxy, root)
				}
			})
		}
	}
}

// startDNS starts the pod's DNS proxy on dnsProxyPort, over UDP on loopback (where REDIRECT
// delivers, and the address its answers must come from) and over TCP, and the peer's
// nameserver on 53 on every peer address.
func startDNS(t *testing.T, w *world) {
	for _, lo := range []string{"127.0.0.1", "::1"} {
		nt.StartUDPServer(t, w.Pod, nt.HostPort(lo, dnsProxyPort), "dns-proxy")
	}
	w.dns = nt.StartProxy(t, w.Pod, dnsProxyPort)
	for _, a := range []string{nt.PeerIPv4, nt.PeerIPv6, nt.PeerExtraIPv4A, nt.PeerExtraIPv4B, nt.PeerExtraIPv6A, nt.PeerExtraIPv6B} {
		nt.StartUDPServer(t, w.Peer, nt.HostPort(a, 53), "nameserver")
	}
	nt.StartServer(t, w.Peer, nt.HostPort("", 53))
}

// Who answers a DNS query over TCP.
const (
	tcpDNSProxy   = "the DNS proxy"
	tcpOutbound   = "the outbound proxy" // not captured as DNS: outbound TCP like any other
	tcpNameserver = "the nameserver"
)

// expectDNS sends a query to ns over UDP and over TCP, and checks who answered: the pod's DNS
// proxy (captured) or the nameserver over UDP, tcp over TCP. A UDP answer comes from a
// connected socket, which takes datagrams from ns only: the proxy's answer went back as ns, its
// original destination. Over TCP the proxy reads the original destination from the socket.
func expectDNS(t *testing.T, w *world, ns string, o nt.DialOpts, captured bool, tcp string) {
	t.Helper()
	want := "nameserver"
	if captured {
		want = "dns-proxy"
	}
	if got, err := nt.Dial(t, w.Pod, "udp", ns, o); err != nil || got != want {
		t.Errorf("UDP query to %s (uid %d gid %d): %q, %v; want %q", ns, o.UID, o.GID, got, err, want)
	}
	switch tcp {
	case tcpDNSProxy:
		w.expectProxyOn(t, w.dns, w.Pod, ns, dnsProxyPort, o)
	case tcpOutbound:
		w.expectProxy(t, w.Pod, ns, outboundProxy, o)
	default:
		expectDirect(t, w.Pod, ns, o)
	}
}

// net1Config is the suite's config without its subnet ignore lists, which cover net1's
// addresses, and with net1 ignored or not.
func net1Config(ignore bool) iptables.Config {
	c := suiteConfig()
	c.InboundSubnetsToIgnore, c.OutboundSubnetsToIgnore = nil, nil
	if ignore {
		c.InterfacesToIgnore = []string{net1}
	}
	return c
}

// addNet1 joins pod and peer by a second link, net1, with servers behind it.
func addNet1(t *testing.T, w *world) {
	w.AddLink(t, net1, []string{podNet1v4 + "/25", podNet1v6 + "/64"}, []string{peerNet1v4 + "/25", peerNet1v6 + "/64"})
}

// addVM puts a virtual machine behind the pod, on its link vmTap.
func addVM(t *testing.T, w *world) { w.vm = w.AddVM(t, vmTap) }

// expectVM checks where the virtual machine's outbound TCP lands: on the proxy's port, with
// SO_ORIGINAL_DST the destination the VM dialled and the VM's own address as the source. When
// that is the outbound port (rerouted), the outbound ignore lists still let it go out as it is,
// the inbound ones do not, and the pod's own traffic on eth0 is redirected as ever.
func expectVM(t *testing.T, w *world, port int) {
	t.Helper()
	for _, f := range []struct {
		family
		vm string
	}{{families[0], nt.VMIPv4}, {families[1], nt.VMIPv6}} {
		dsts := []string{nt.HostPort(f.peer, peerPort)}
		if port == outboundProxy {
			// The inbound ignore list's port, which the VM's outbound TCP does not skip by.
			dsts = append(dsts, nt.HostPort(f.peer, skipInPort))
		}
		for _, dst := range dsts {
			reply, err := nt.Dial(t, w.vm, "tcp", dst, root)
			if err != nil || reply != "proxy "+itoa(port) {
				t.Errorf("from the VM to %s: %q, %v; want the proxy's answer on %d", dst, reply, err, port)
				continue
			}
			if c := w.proxy.Expect(t, 2*time.Second); c.OriginalDst.String() != dst || c.Remote.Addr() != mustAddr(f.vm) {
				t.Errorf("from the VM to %s: the proxy saw %s, want the original destination %s from %s", dst, c, dst, f.vm)
			}
		}
		if port != outboundProxy {
			continue
		}
		expectDirect(t, w.vm, nt.HostPort(f.peerSkip, peerPort), root)
		expectDirect(t, w.vm, nt.HostPort(f.peer, skipOutPort), root)
		w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, root)
		w.expectProxy(t, w.Peer, nt.HostPort(f.pod, appPort), inboundProxy, root)
	}
}

func removeAddr(t *testing.T, n *nt.NS, link, cidr string) {
	t.Helper()
	if err := n.Do(func() error {
		l, err := netlink.LinkByName(link)
		if err != nil {
			return err
		}
		a, err := netlink.ParseAddr(cidr)
		if err != nil {
			return err
		}
		return netlink.AddrDel(l, a)
	}); err != nil {
		t.Fatalf("remove %s from %s: %v", cidr, link, err)
	}
}

// policyRouting lists, as netlink reports them, the ip rules that look up the TPROXY table and
// the routes in it, in both families.
func policyRouting(t *testing.T, n *nt.NS) []string {
	t.Helper()
	var out []string
	if err := n.Do(func() error {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := netlink.RuleList(fam)
			if err != nil {
				return err
			}
			for _, r := range rules {
				if r.Table == int(iptables.TPROXYTable) || r.Mark == iptables.TPROXYMark {
					out = append(out, fmt.Sprintf("rule family %d priority %d mark %#x table %d", fam, r.Priority, r.Mark, r.Table))
				}
			}
			routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: int(iptables.TPROXYTable)}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			for _, r := range routes {
				out = append(out, fmt.Sprintf("route family %d %s table %d", fam, r.Dst, r.Table))
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("read the policy routing: %v", err)
	}
	return out
}

// startHolder is the inbound proxy of the drop-invalid cases: it keeps what it accepts open,
// so the connection stays ESTABLISHED in conntrack, and echoes each first line back.
func startHolder(t *testing.T, n *nt.NS) {
	var mu sync.Mutex
	var conns []net.Conn
	for _, network := range []string{"tcp4", "tcp6"} {
		var ln net.Listener
		if err := n.Do(func() error {
			var err error
			ln, err = net.Listen(network, nt.HostPort(map[string]string{"tcp4": "0.0.0.0", "tcp6": "::"}[network], holdPort))
			return err
		}); err != nil {
			t.Fatal(err)
		}
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				mu.Lock()
				conns = append(conns, c)
				mu.Unlock()
				go func() { _, _ = io.Copy(c, io.LimitReader(c, 6)) }()
			}
		}()
		t.Cleanup(func() { _ = ln.Close() })
	}
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			_ = c.Close()
		}
	})
}

// expectOutOfWindow opens a connection from the peer to the app's port (redirected to the
// holder), then sends, from a raw socket on the peer, TCP segments on that connection's
// addresses and ports with sequence numbers half the sequence space apart: at least one is out
// of conntrack's window whatever the connection's numbers, so conntrack marks it INVALID. An
// INVALID packet skips NAT: unless dropped it reaches the app's own port, which has no such
// connection and answers with a reset. reaches says which is expected; conntrack's invalid
// counter shows the segments were seen either way.
func expectOutOfWindow(t *testing.T, w *world, reaches bool) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			var c net.Conn
			if err := w.Peer.Do(func() error {
				var err error
				c, err = net.DialTimeout("tcp", nt.HostPort(f.pod, appPort), 3*time.Second)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(3 * time.Second))
			buf := make([]byte, 6)
			if _, err := c.Write([]byte("hello\n")); err != nil {
				t.Fatal(err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				t.Fatalf("the holder did not echo: %v", err)
			}
			invalid0, rsts0 := podCounters(t, w.Pod)
			local, remote := c.LocalAddr().(*net.TCPAddr).AddrPort(), c.RemoteAddr().(*net.TCPAddr).AddrPort()
			for _, seq := range []uint32{0x01234567, 0x81234567} {
				sendSegment(t, w.Peer, local, remote, seq, seq^0x40000000, []byte("x"))
			}
			deadline := time.Now().Add(2 * time.Second)
			var invalid, rsts uint64
			for {
				invalid, rsts = podCounters(t, w.Pod)
				if (invalid > invalid0 && (!reaches || rsts > rsts0)) || time.Now().After(deadline) {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if invalid == invalid0 {
				t.Fatalf("conntrack marked none of the segments INVALID (invalid counter %d)", invalid)
			}
			if !reaches {
				// The reset would follow the conntrack verdict within the same softirq.
				time.Sleep(100 * time.Millisecond)
				_, rsts = podCounters(t, w.Pod)
			}
			if got := rsts > rsts0; got != reaches {
				t.Errorf("INVALID segment reached the app's port (the pod reset it): %v, want %v (OutRsts %d -> %d, invalid %d -> %d)",
					got, reaches, rsts0, rsts, invalid0, invalid)
			}
			// The connection itself is unharmed.
			if _, err := c.Write([]byte("again\n")); err != nil {
				t.Errorf("write after the segments: %v", err)
			}
		})
	}
}

// podCounters reads, inside n, conntrack's invalid counter (summed over CPUs) and TCP's OutRsts.
func podCounters(t *testing.T, n *nt.NS) (invalid, outRsts uint64) {
	t.Helper()
	if err := n.Do(func() error {
		ct, err := os.ReadFile("/proc/thread-self/net/stat/nf_conntrack")
		if err != nil {
			return err
		}
		lines := strings.Split(strings.TrimSpace(string(ct)), "\n")
		col := indexOf(strings.Fields(lines[0]), "invalid")
		for _, l := range lines[1:] {
			v, err := strconv.ParseUint(strings.Fields(l)[col], 16, 64)
			if err != nil {
				return err
			}
			invalid += v
		}
		snmp, err := os.ReadFile("/proc/thread-self/net/snmp")
		if err != nil {
			return err
		}
		var head []string
		for _, l := range strings.Split(string(snmp), "\n") {
			if !strings.HasPrefix(l, "Tcp:") {
				continue
			}
			if head == nil {
				head = strings.Fields(l)
				continue
			}
			outRsts, err = strconv.ParseUint(strings.Fields(l)[indexOf(head, "OutRsts")], 10, 64)
			return err
		}
		return fmt.Errorf("no Tcp lines in snmp")
	}); err != nil {
		t.Fatalf("read counters in %s: %v", n, err)
	}
	return invalid, outRsts
}

func indexOf(fields []string, name string) int {
	for i, f := range fields {
		if f == name {
			return i
		}
	}
	return -1
}

// sendSegment sends, from a raw socket inside n, one TCP segment (ACK and PSH) from src to dst.
func sendSegment(t *testing.T, n *nt.NS, src, dst netip.AddrPort, seq, ack uint32, payload []byte) {
	t.Helper()
	seg := make([]byte, 20+len(payload))
	binary.BigEndian.PutUint16(seg[0:], src.Port())
	binary.BigEndian.PutUint16(seg[2:], dst.Port())
	binary.BigEndian.PutUint32(seg[4:], seq)
	binary.BigEndian.PutUint32(seg[8:], ack)
	seg[12] = 5 << 4
	seg[13] = 0x18 // PSH, ACK
	binary.BigEndian.PutUint16(seg[14:], 65535)
	copy(seg[20:], payload)
	binary.BigEndian.PutUint16(seg[16:], tcpChecksum(src.Addr(), dst.Addr(), seg))
	if err := n.Do(func() error {
		var fam int
		var sa, bind unix.Sockaddr
		if s, d := src.Addr().Unmap(), dst.Addr().Unmap(); d.Is4() {
			fam, sa, bind = unix.AF_INET, &unix.SockaddrInet4{Addr: d.As4()}, &unix.SockaddrInet4{Addr: s.As4()}
		} else {
			fam, sa, bind = unix.AF_INET6, &unix.SockaddrInet6{Addr: d.As16()}, &unix.SockaddrInet6{Addr: s.As16()}
		}
		fd, err := unix.Socket(fam, unix.SOCK_RAW, unix.IPPROTO_TCP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		if err := unix.Bind(fd, bind); err != nil {
			return err
		}
		return unix.Sendto(fd, seg, 0, sa)
	}); err != nil {
		t.Fatalf("send a raw segment %s -> %s: %v", src, dst, err)
	}
}

// tcpChecksum is the TCP checksum of seg over the pseudo-header of src and dst.
func tcpChecksum(src, dst netip.Addr, seg []byte) uint16 {
	var pseudo []byte
	if src.Is4() || src.Is4In6() {
		s, d := src.Unmap().As4(), dst.Unmap().As4()
		pseudo = append(append(append(pseudo, s[:]...), d[:]...), 0, unix.IPPROTO_TCP, byte(len(seg)>>8), byte(len(seg)))
	} else {
		s, d := src.As16(), dst.As16()
		pseudo = append(append(pseudo, s[:]...), d[:]...)
		pseudo = binary.BigEndian.AppendUint32(pseudo, uint32(len(seg)))
		pseudo = append(pseudo, 0, 0, 0, unix.IPPROTO_TCP)
	}
	var sum uint32
	data := append(pseudo, seg...)
	for i := 0; i+1 < len(data); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(data[i:]))
	}
	if len(data)%2 == 1 {
		sum += uint32(data[len(data)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	return ^uint16(sum)
}

// TestTPROXYWithLoopbackDown: the kernel refuses TPROXY's IPv6 route through a loopback that is
// down; the apply fails saying so, and nothing stays written (the IPv4 route added first is
// taken out again).
func TestTPROXYWithLoopbackDown(t *testing.T) {
	w := newWorld(t)
	if err := w.Pod.Do(func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetDown(lo)
	}); err != nil {
		t.Fatal(err)
	}
	cfg := suiteConfig()
	cfg.InboundMode, cfg.Mode = iptables.InboundTPROXY, iptables.ModeNFTables
	rs, err := iptables.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = runner.Runner{}.Apply(context.Background(), target(w, iptables.ModeNFTables), rs)
	want := "add the policy routing TPROXY needs (nothing else was written): add ip -6 route: local ::/0 dev lo table 4143: netlink receive: network is down: the namespace's loopback interface is down"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("apply: %v, want an error with %q", err, want)
	}
	if left := residue(t, w.Pod); left != "" {
		t.Errorf("written:\n%s", left)
	}
}
