package netnstest

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Addresses of a Pair. The pod and peer share 192.0.2.0/24 and
// 2001:db8::/64 on their eth0; the extra peer addresses live on the peer's
// eth0 as host addresses and the pod reaches their whole prefixes through the
// peer, so tests can dial "somewhere outside the pod" on several subnets (for
// outbound subnet skips) and the peer can dial the pod from several sources
// (for inbound source-subnet skips).
const (
	IfName = "eth0" // the veth end in each namespace

	PodIPv4  = "192.0.2.10"
	PodIPv6  = "2001:db8::10"
	PeerIPv4 = "192.0.2.20"
	PeerIPv6 = "2001:db8::20"

	PeerExtraIPv4A = "198.51.100.20"
	PeerExtraIPv4B = "203.0.113.20"
	PeerExtraIPv6A = "2001:db8:1::20"
	PeerExtraIPv6B = "2001:db8:2::20"

	// Prefixes routed from the pod via the peer (covering the extra addresses).
	PeerExtraNetIPv4A = "198.51.100.0/24"
	PeerExtraNetIPv4B = "203.0.113.0/24"
	PeerExtraNetIPv6A = "2001:db8:1::/64"
	PeerExtraNetIPv6B = "2001:db8:2::/64"

	LinkNetIPv4 = "192.0.2.0/24"
	LinkNetIPv6 = "2001:db8::/64"
)

// HostPort joins an address constant and a port: HostPort(PodIPv6, 8080) is
// "[2001:db8::10]:8080".
func HostPort(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }

// AddrPort is HostPort as a netip.AddrPort, for comparing with Conn fields.
// It panics on a malformed ip, which is a bug in the test.
func AddrPort(ip string, port int) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(ip), uint16(port))
}

// Pair is a pod namespace and a peer namespace joined by a veth pair; think of
// the peer as "the rest of the cluster".
type Pair struct {
	Pod  *NS
	Peer *NS

	links int // how many AddLink added
}

// NewPair creates the two namespaces, the veth pair between them and all
// addresses and routes (see the constants). Everything is removed by
// t.Cleanup: deleting the namespaces deletes the veth.
func NewPair(t testing.TB) *Pair {
	t.Helper()
	return newPair(t, newNS(t, "pod"))
}

// NewUserNSPair is NewPair with the pod's network namespace owned by a user namespace of its own,
// as the kubelet gives a pod with hostUsers: false (NewUserNS).
func NewUserNSPair(t testing.TB) *Pair {
	t.Helper()
	return newPair(t, NewUserNS(t))
}

func newPair(t testing.TB, pod *NS) *Pair {
	t.Helper()
	p := &Pair{Pod: pod, Peer: newNS(t, "peer")}
	// The pod's addresses are on-link for the peer (connected /24 and /64
	// routes), so replies to the pod, from any of the peer's addresses, need
	// no extra routes.
	p.addLink(t, IfName, podIfIndex, []string{PodIPv4 + "/24", PodIPv6 + "/64"}, []route{
		{PeerExtraNetIPv4A, PeerIPv4},
		{PeerExtraNetIPv4B, PeerIPv4},
		{PeerExtraNetIPv6A, PeerIPv6},
		{PeerExtraNetIPv6B, PeerIPv6},
	}, []string{
		PeerIPv4 + "/24", PeerIPv6 + "/64",
		PeerExtraIPv4A + "/32", PeerExtraIPv4B + "/32",
		PeerExtraIPv6A + "/128", PeerExtraIPv6B + "/128",
	})
	return p
}

// AddLink joins the pair by a second veth, name at both ends, with podAddrs and peerAddrs
// (CIDRs) on its ends: a secondary network such as Multus attaches. It goes with the
// namespaces.
func (p *Pair) AddLink(t testing.TB, name string, podAddrs, peerAddrs []string) {
	t.Helper()
	p.links++
	p.addLink(t, name, podIfIndex+p.links, podAddrs, nil, peerAddrs)
}

// addLink creates the veth name between pod and peer, the pod's end with ifindex index, and
// configures both ends.
func (p *Pair) addLink(t testing.TB, name string, index int, podAddrs []string, podRoutes []route, peerAddrs []string) {
	t.Helper()
	// The veth is created from a netlink socket opened inside the pod
	// namespace, and its peer end is born directly in the peer namespace: no
	// moment exists in which either end is in the root namespace.
	peerFile, err := os.Open(p.Peer.Path())
	if err != nil {
		t.Fatalf("open peer netns: %v", err)
	}
	defer peerFile.Close()

	if err := p.Pod.Do(func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("open netlink: %w", err)
		}
		defer h.Close()
		veth := &netlink.Veth{
			// Both namespaces are fresh, so both ends would get ifindex 2.
			// The kernel treats a carrier change on a device whose ifindex
			// equals its iflink (the veth peer's index) as non-urgent and
			// delays it by up to a second, keeping IPv6 unready and
			// dropping the first neighbour solicitation. A distinct index
			// makes link-up immediate.
			LinkAttrs:     netlink.LinkAttrs{Name: name, Index: index},
			PeerName:      name,
			PeerNamespace: netlink.NsFd(int(peerFile.Fd())),
		}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", name, err)
		}
		return configure(h, name, podAddrs, podRoutes)
	}); err != nil {
		t.Fatalf("set up pod side of %s: %v", name, err)
	}
	if err := p.Peer.Do(func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("open netlink: %w", err)
		}
		defer h.Close()
		return configure(h, name, peerAddrs, nil)
	}); err != nil {
		t.Fatalf("set up peer side of %s: %v", name, err)
	}
	// Wait until both ends are operationally up: only then has IPv6 started
	// on them (and the qdisc been activated), so the first packet of a test
	// is not dropped.
	for _, n := range []*NS{p.Pod, p.Peer} {
		if err := n.Do(func() error { return waitOperUp(name) }); err != nil {
			t.Fatalf("%s: %v", n, err)
		}
	}
}

// linkUpTimeout bounds waitOperUp; with the distinct ifindex the links are
// normally up within a millisecond.
const linkUpTimeout = 5 * time.Second

func waitOperUp(name string) error {
	h, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("open netlink: %w", err)
	}
	defer h.Close()
	deadline := time.Now().Add(linkUpTimeout)
	for {
		link, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("find %s: %w", name, err)
		}
		if link.Attrs().OperState == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not operationally up after %v (state %s)", name, linkUpTimeout, link.Attrs().OperState)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// podIfIndex is the pod's eth0 interface index; see NewPair.
const podIfIndex = 10

type route struct{ dst, gw string }

// configure brings link name up with the given addresses and gateway routes.
func configure(h *netlink.Handle, name string, addrs []string, routes []route) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	for _, a := range addrs {
		pfx := netip.MustParsePrefix(a)
		addr := &netlink.Addr{IPNet: prefixToIPNet(pfx)}
		if pfx.Addr().Is6() {
			// No duplicate address detection: the address is usable at
			// once instead of after a second of tentative state.
			addr.Flags = unix.IFA_F_NODAD
		}
		if err := h.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("add address %s to %s: %w", a, name, err)
		}
	}
	if err := h.LinkSetUp(link); err != nil {
		return fmt.Errorf("set %s up: %w", name, err)
	}
	for _, r := range routes {
		rt := &netlink.Route{
			LinkIndex: link.Attrs().Index,
			Dst:       prefixToIPNet(netip.MustParsePrefix(r.dst)),
			Gw:        net.IP(netip.MustParseAddr(r.gw).AsSlice()),
		}
		if err := h.RouteAdd(rt); err != nil {
			return fmt.Errorf("add route %s via %s: %w", r.dst, r.gw, err)
		}
	}
	return nil
}

func prefixToIPNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{
		IP:   net.IP(p.Addr().AsSlice()),
		Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen()),
	}
}
