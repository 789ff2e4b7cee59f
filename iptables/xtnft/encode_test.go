package xtnft

import (
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"strconv"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// The extension info blobs, as iptables-nft 1.8.9 wrote them for our golden payloads on x86-64
// (dumped with google/nftables after iptables-nft-restore). The root tests prove the whole rules
// equal through iptables-nft-save; these pin the C structs without root.
func TestInfoBlobsAsIPTablesNFT(t *testing.T) {
	if binary.NativeEndian.Uint16([]byte{1, 0}) != 1 {
		t.Skip("the captured blobs are little-endian")
	}
	ranges := []iptables.PortRange{{First: 4190, Last: 4191}, {First: 5000, Last: 5000}, {First: 6000, Last: 7000}, {First: 8000, Last: 9000},
		{First: 10000, Last: 11000}, {First: 12000, Last: 13000}, {First: 14000, Last: 15000}, {First: 16000, Last: 17000}}
	mp := func(ports []iptables.PortRange) []byte {
		b, err := multiportInfo(ports)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		what string
		got  []byte
		want string
	}{
		{"owner --uid-owner 2102", ownerInfo(xtOwnerUID, 2102), "360800003608000000000000000000000100000000000000"},
		{"owner --gid-owner 2103", ownerInfo(xtOwnerGID, 2103), "000000000000000037080000370800000200000000000000"},
		{"multiport --dports 4190,4191,4567,4568", mp([]iptables.PortRange{{First: 4190, Last: 4190}, {First: 4191, Last: 4191}, {First: 4567, Last: 4567}, {First: 4568, Last: 4568}}),
			"01045e105f10d711d811" + strings.Repeat("00", 38)},
		{"multiport --dports 4190:4191,5000,6000:7000,...,16000:17000", mp(ranges),
			"010f5e105f1088137017581b401f28231027f82ae02ec832b036983a803e684201000001000100010001000100010000"},
		{"multiport --dports 25:26", mp([]iptables.PortRange{{First: 25, Last: 26}}), "010219001a00" + strings.Repeat("00", 26) + "01" + strings.Repeat("00", 15)},
		{"ip REDIRECT --to-ports 4140", redirectInfo(iptables.IPv4, 4140), "01000000020000000000000000000000102c102c00000000"},
		{"ip6 REDIRECT --to-ports 4140", redirectInfo(iptables.IPv6, 4140), "02000000" + strings.Repeat("00", 32) + "102c102c"},
	} {
		if got := hex.EncodeToString(c.got); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.what, got, c.want)
		}
	}
	// The NAT target blobs also read back through google/nftables' own types.
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		info, err := xt.Unmarshal("REDIRECT", xt.TableFamily(family(f)), redirectRev, redirectInfo(f, 4143))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		back, err := xt.Marshal(xt.TableFamily(family(f)), redirectRev, info)
		if err != nil || hex.EncodeToString(back) != hex.EncodeToString(redirectInfo(f, 4143)) {
			t.Errorf("%s: REDIRECT info %T does not survive google/nftables: %x, %v", f, info, back, err)
		}
	}
}

// eachGoldenRule calls fn with every rule of every golden config, in every family it writes.
func eachGoldenRule(t *testing.T, fn func(name string, f iptables.Family, r iptables.XTRule)) {
	t.Helper()
	for name, c := range iptables.GoldenConfigs() {
		rs, err := iptables.Build(c)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range rs.Families {
			for _, r := range rs.XTRules(f) {
				fn(name, f, r)
			}
		}
	}
}

// Every rule of every golden config decodes back to itself, and without any one of its
// expressions it is no longer the same rule.
func TestDecodeIsStrictInverse(t *testing.T) {
	eachGoldenRule(t, func(name string, f iptables.Family, r iptables.XTRule) {
		e, err := encode(f, r)
		if err != nil {
			t.Fatalf("%s %s %q: %v", name, f, r.Rule(), err)
		}
		back, ok := decode(f, r.Chain, e.exprs)
		if !ok || back.Rule() != r.Rule() {
			t.Errorf("%s %s: %q decodes to %q (ok %v)", name, f, r.Rule(), back.Rule(), ok)
		}
		for i := range e.exprs {
			if back, ok := decode(f, r.Chain, append(e.exprs[:i:i], e.exprs[i+1:]...)); ok && back.Rule() == r.Rule() {
				t.Errorf("%s %s %q: still the same rule without expression %d (%T)", name, f, r.Rule(), i, e.exprs[i])
			}
		}
	})
	// A counter that counted is still our rule; a verdict that differs is not.
	r := iptables.XTRule{Chain: iptables.OutputChain, OutInterface: "lo", Comment: "proxy-init/ignore-loopback", Target: iptables.TargetReturn}
	e, _ := encode(iptables.IPv4, r)
	for i, x := range e.exprs {
		if _, ok := x.(*expr.Counter); ok {
			e.exprs[i] = &expr.Counter{Packets: 7, Bytes: 420}
		}
	}
	if _, ok := decode(iptables.IPv4, r.Chain, e.exprs); !ok {
		t.Error("a rule whose counter counted packets is no longer ours")
	}
	e.exprs[len(e.exprs)-1] = &expr.Verdict{Kind: expr.VerdictAccept}
	if _, ok := decode(iptables.IPv4, r.Chain, e.exprs); ok {
		t.Error("a rule that accepts instead of returning counts as ours")
	}
}

// Addresses: a byte-aligned prefix loads only its bytes; any other prefix loads the address and
// masks it, as iptables-nft does; /0 matches nothing at all.
func TestAddressMatch(t *testing.T) {
	for _, c := range []struct {
		prefix string
		want   string
	}{
		{"198.51.100.0/24", "payload 12+3 cmp c63364"},
		{"203.0.113.7/32", "payload 12+4 cmp cb007107"},
		{"192.0.2.0/25", "payload 12+4 bitwise ffffff80 cmp c0000200"},
		{"2001:db8:1::/48", "payload 8+6 cmp 20010db80001"},
		{"2001:db8:3::1/128", "payload 8+16 cmp 20010db8000300000000000000000001"},
	} {
		p := netip.MustParsePrefix(c.prefix)
		f := iptables.IPv4
		if p.Addr().Is6() {
			f = iptables.IPv6
		}
		var parts []string
		s := &exprSink{}
		addrMatch(s, f, p, true)
		for _, e := range s.out {
			switch e := e.(type) {
			case *expr.Payload:
				parts = append(parts, "payload "+itoa(e.Offset)+"+"+itoa(e.Len))
			case *expr.Bitwise:
				parts = append(parts, "bitwise "+hex.EncodeToString(e.Mask))
			case *expr.Cmp:
				parts = append(parts, "cmp "+hex.EncodeToString(e.Data))
			}
		}
		if got := strings.Join(parts, " "); got != c.want {
			t.Errorf("-s %s: %s, want %s", c.prefix, got, c.want)
		}
	}
	e, err := encode(iptables.IPv4, iptables.XTRule{Chain: iptables.OutputChain, Destination: netip.MustParsePrefix("0.0.0.0/0"), Comment: "x", Target: iptables.TargetReturn})
	if err != nil || len(e.exprs) != 3 {
		t.Errorf("-d 0.0.0.0/0 should add no match: %v, %d expressions", err, len(e.exprs))
	}
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

func TestEncodeRefuses(t *testing.T) {
	lo := iptables.XTRule{Chain: iptables.OutputChain, Comment: "c", Target: iptables.TargetReturn}
	for _, c := range []struct {
		what string
		r    func(iptables.XTRule) iptables.XTRule
		want string
	}{
		{"v6 address in v4", func(r iptables.XTRule) iptables.XTRule {
			r.Source = netip.MustParsePrefix("2001:db8::/32")
			return r
		}, `address 2001:db8::/32 in an ipv4 rule`},
		{"16 ports", func(r iptables.XTRule) iptables.XTRule {
			r.TCP = true
			for p := range 8 {
				r.MultiportDPorts = append(r.MultiportDPorts, iptables.PortRange{First: uint16(100 + 10*p), Last: uint16(105 + 10*p)})
			}
			return r
		}, "more than 15 multiport ports (a range counts two)"},
		{"long comment", func(r iptables.XTRule) iptables.XTRule {
			r.Comment = strings.Repeat("x", 256)
			return r
		}, "is longer than iptables allows (255 bytes)"},
		{"unknown target", func(r iptables.XTRule) iptables.XTRule {
			r.Target = "ACCEPT"
			return r
		}, `target "ACCEPT" is not one of ours`},
		{"redirect to 0", func(r iptables.XTRule) iptables.XTRule {
			r.Target = iptables.TargetRedirect
			return r
		}, "redirect to port 0"},
	} {
		_, err := encode(iptables.IPv4, c.r(lo))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.what, err, c.want)
		}
	}
}

// The expressions the wire sink lays out are byte for byte what google/nftables marshals for
// the expressions of the same rule, for every kind of expression encode writes.
func TestWireMatchesMarshal(t *testing.T) {
	extra := []iptables.XTRule{
		{Chain: iptables.OutputChain, Destination: netip.MustParsePrefix("192.0.2.0/25"), Comment: "bitwise", Target: iptables.TargetReturn},
		{Chain: iptables.RedirectChain, TCP: true, DPort: iptables.PortRange{First: 10000, Last: 10010}, Comment: "range", Target: iptables.TargetRedirect, ToPort: 4143},
		{Chain: "OUTPUT", OutInterface: "eth+", Comment: "jump", Target: iptables.OutputChain},
	}
	check := func(what string, f iptables.Family, r iptables.XTRule) {
		e, err := encode(f, r)
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		var list []netlink.Attribute
		for _, x := range e.exprs {
			data, err := expr.Marshal(family(f), x)
			if err != nil {
				t.Fatal(err)
			}
			list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: data})
		}
		inner, err := netlink.MarshalAttributes(list)
		if err != nil {
			t.Fatal(err)
		}
		want, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_RULE_EXPRESSIONS, Data: inner}})
		if err != nil {
			t.Fatal(err)
		}
		var m msgs
		open := m.nest(unix.NFTA_RULE_EXPRESSIONS)
		if _, err := encodeTo(f, r, wire{&m}); err != nil {
			t.Fatal(err)
		}
		m.unnest(open)
		if hex.EncodeToString(m.b) != hex.EncodeToString(want) {
			t.Errorf("%s:\n got %x\nwant %x", what, m.b, want)
		}
	}
	eachGoldenRule(t, func(name string, f iptables.Family, r iptables.XTRule) { check(name+" "+r.Rule().String(), f, r) })
	for _, r := range extra {
		check(r.Comment, iptables.IPv4, r)
	}
}
