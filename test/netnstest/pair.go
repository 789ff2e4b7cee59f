package netnstest

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
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

	// A virtual machine's link (AddVM): the pod's end, the VM's, and their subnets, which the
	// peer routes through the pod.
	PodVMIPv4  = "203.0.113.65"
	VMIPv4     = "203.0.113.66"
	VMNetIPv4  = "203.0.113.64/26"
	PodVMIPv6  = "2001:db8:6::1"
	VMIPv6     = "2001:db8:6::2"
	VMNetIPv6  = "2001:db8:6::/64"
	vmIfIndex  = 30
	vmLinkName = "eth0" // the VM's own end of its link
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

// AddVM adds a virtual machine behind the pod, as KubeVirt runs one: a namespace of its own,
// joined to the pod by the veth name (the VM's tap, as the pod sees it), with its default routes
// through the pod. The pod forwards between the VM and the peer, and the peer routes the VM's
// subnets back through the pod, so a connection the rules leave alone goes from the VM to the
// peer's servers as the pod's own would. It all goes with the namespaces.
func (p *Pair) AddVM(t testing.TB, name string) *NS {
	t.Helper()
	vm := newNS(t, "vm")
	p.link(t, vm, name, vmLinkName, vmIfIndex, []string{PodVMIPv4 + "/26", PodVMIPv6 + "/64"}, nil,
		[]string{VMIPv4 + "/26", VMIPv6 + "/64"}, []route{{"0.0.0.0/0", PodVMIPv4}, {"::/0", PodVMIPv6}})
	if err := p.Pod.Do(func() error {
		for _, f := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
			if err := os.WriteFile(filepath.Join("/proc/sys", f), []byte("1"), 0o644); err != nil {
				return fmt.Errorf("write sysctl %s: %w", f, err)
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("let the pod forward: %v", err)
	}
	if err := p.Peer.Do(func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("open netlink: %w", err)
		}
		defer h.Close()
		return addRoutes(h, IfName, []route{{VMNetIPv4, PodIPv4}, {VMNetIPv6, PodIPv6}})
	}); err != nil {
		t.Fatalf("route the VM's subnets on the peer: %v", err)
	}
	return vm
}

// addLink creates the veth name between pod and peer, the pod's end with ifindex index, and
// configures both ends.
func (p *Pair) addLink(t testing.TB, name string, index int, podAddrs []string, podRoutes []route, peerAddrs []string) {
	t.Helper()
	p.link(t, p.Peer, name, name, index, podAddrs, podRoutes, peerAddrs, nil)
}

// link creates a veth between the pod (its end named name, with ifindex index) and far (its end
// named farName), and configures both ends.
func (p *Pair) link(t testing.TB, far *NS, name, farName string, index int, podAddrs []string, podRoutes []route, farAddrs []string, farRoutes []route) {
	t.Helper()
	// The veth is created from a netlink socket opened inside the pod
	// namespace, and its far end is born directly in the far namespace: no
	// moment exists in which either end is in the root namespace.
	farFile, err := os.Open(far.Path())
	if err != nil {
		t.Fatalf("open %s netns: %v", far.Name(), err)
	}
	defer farFile.Close()

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
			PeerName:      farName,
			PeerNamespace: netlink.NsFd(int(farFile.Fd())),
		}
		if err := h.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth %s: %w", name, err)
		}
		return configure(h, name, podAddrs, podRoutes)
	}); err != nil {
		t.Fatalf("set up pod side of %s: %v", name, err)
	}
	if err := far.Do(func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return fmt.Errorf("open netlink: %w", err)
		}
		defer h.Close()
		return configure(h, farName, farAddrs, farRoutes)
	}); err != nil {
		t.Fatalf("set up %s side of %s: %v", far.Name(), name, err)
	}
	// Wait until both ends are operationally up: only then has IPv6 started
	// on them (and the qdisc been activated), so the first packet of a test
	// is not dropped.
	for _, e := range []struct {
		n    *NS
		name string
	}{{p.Pod, name}, {far, farName}} {
		if err := e.n.Do(func() error { return waitOperUp(e.name) }); err != nil {
			t.Fatalf("%s: %v", e.n, err)
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
	return addRoutes(h, name, routes)
}

// addRoutes adds gateway routes through link name.
func addRoutes(h *netlink.Handle, name string, routes []route) error {
	link, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
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
