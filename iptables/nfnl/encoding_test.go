package nfnl

import (
	"encoding/binary"
	"encoding/hex"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

// The extension info blobs, as iptables-nft 1.8.9 wrote them for our golden payloads on x86-64
// (dumped with google/nftables after iptables-nft-restore). The root tests prove the whole rules
// equal through iptables-nft-save; these pin the C structs without root, the two laid out here
// and the REDIRECT ranges google/nftables' xt types marshal.
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
	redirect := func(f iptables.Family) []byte {
		b, err := xt.Marshal(xt.TableFamily(xtFamily(f)), redirectRev, redirectInfo(f, 4140))
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
		{"ip REDIRECT --to-ports 4140", redirect(iptables.IPv4), "01000000020000000000000000000000102c102c00000000"},
		{"ip6 REDIRECT --to-ports 4140", redirect(iptables.IPv6), "02000000" + strings.Repeat("00", 32) + "102c102c"},
	} {
		if got := hex.EncodeToString(c.got); got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.what, got, c.want)
		}
	}
}

// eachGoldenRule calls fn with every rule of every golden config, in every family it writes.
func eachGoldenRule(t *testing.T, fn func(name string, f iptables.Family, r iptables.XTRule)) {
	t.Helper()
	for name, c := range iptablestest.GoldenConfigs() {
		rs := iptablestest.Build(t, c)
		for _, f := range rs.Families {
			for _, r := range append(rs.XTRules(f), rs.XTJumps()...) {
				fn(name, f, r)
			}
		}
	}
}

// roundTrip marshals the expressions and reads them back, as the kernel hands them over.
func roundTrip(t *testing.T, fam byte, exprs []expr.Any) rule {
	t.Helper()
	b := &Batch{}
	b.begin(unix.NFT_MSG_NEWRULE, 0, fam)
	b.expressions(fam, exprs)
	b.add(what{})
	if b.err != nil {
		t.Fatal(b.err)
	}
	r, _, _, err := decodeRule(fam, b.messages(t)[0])
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Every rule of every golden config decodes back to itself after a trip through the wire form,
// and without any one of its expressions it is no longer the same rule.
func TestDecodeIsStrictInverse(t *testing.T) {
	eachGoldenRule(t, func(name string, f iptables.Family, r iptables.XTRule) {
		e, _, err := encodeXT(f, r)
		if err != nil {
			t.Fatalf("%s %s %q: %v", name, f, r.Rule(), err)
		}
		read := roundTrip(t, xtFamily(f), e)
		back, ok := decodeXT(f, r.TableName(), r.Chain, read)
		if !ok || back.Rule() != r.Rule() {
			t.Errorf("%s %s: %q decodes to %q (ok %v)", name, f, r.Rule(), back.Rule(), ok)
		}
		for i := range e {
			less := rule{exprs: append(slices.Clone(read.exprs[:i]), read.exprs[i+1:]...)}
			if back, ok := decodeXT(f, r.TableName(), r.Chain, less); ok && back.Rule() == r.Rule() {
				t.Errorf("%s %s %q: still the same rule without expression %d (%T)", name, f, r.Rule(), i, e[i])
			}
		}
	})
	// A counter that counted is still our rule; a verdict that differs is not.
	r := iptables.XTRule{Chain: iptables.OutputChain, OutInterface: "lo", Comment: "proxy-init/ignore-loopback", Target: iptables.TargetReturn}
	e, _, _ := encodeXT(iptables.IPv4, r)
	for i, x := range e {
		if _, ok := x.(*expr.Counter); ok {
			e[i] = &expr.Counter{Packets: 7, Bytes: 420}
		}
	}
	if _, ok := decodeXT(iptables.IPv4, r.TableName(), r.Chain, rule{exprs: e}); !ok {
		t.Error("a rule whose counter counted packets is no longer ours")
	}
	e[len(e)-1] = &expr.Verdict{Kind: expr.VerdictAccept}
	if _, ok := decodeXT(iptables.IPv4, r.TableName(), r.Chain, rule{exprs: e}); ok {
		t.Error("a rule that accepts instead of returning counts as ours")
	}
	if _, ok := decodeXT(iptables.IPv4, r.TableName(), r.Chain, rule{exprs: e[:len(e)-1], foreign: "log"}); ok {
		t.Error("a rule with an expression we do not read counts as ours")
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
		for _, e := range addrMatch(nil, nil, f, p, true) {
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
	e, _, err := encodeXT(iptables.IPv4, iptables.XTRule{Chain: iptables.OutputChain, Destination: netip.MustParsePrefix("0.0.0.0/0"), Comment: "x", Target: iptables.TargetReturn})
	if err != nil || len(e) != 3 {
		t.Errorf("-d 0.0.0.0/0 should add no match: %v, %d expressions", err, len(e))
	}
}

func itoa(v uint32) string { return strconv.FormatUint(uint64(v), 10) }

// Every expression of every golden rule is laid into the batch byte for byte as google/nftables
// marshals it, the matches, targets and comparisons Batch.expressions lays out itself included.
func TestExpressionsAsGoogleMarshals(t *testing.T) {
	for name, c := range iptablestest.GoldenConfigs() {
		rs := iptablestest.Build(t, c)
		for _, f := range rs.Families {
			for _, r := range rs.XTRules(f) {
				exprs, _, err := encodeXT(f, r)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range exprs {
					checkLaidOut(t, xtFamily(f), e, name+" "+r.Comment)
				}
			}
		}
		nft := rs.NFT()
		ids := map[string]uint32{}
		for i, s := range nft.Sets {
			ids[s.Name] = uint32(i + 1)
		}
		for _, ch := range nft.Chains {
			for _, r := range ch.Rules {
				exprs, err := nativeExprs(r, ids)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range exprs {
					checkLaidOut(t, famInet, e, name+" native "+r.Comment)
				}
			}
		}
	}
}

// The expressions a batch lends each rule from its pool, reused from rule to rule, lay every
// rule out as fresh ones do.
func TestPooledRulesAsFresh(t *testing.T) {
	for name, c := range iptablestest.GoldenConfigs() {
		rs := iptablestest.Build(t, c)
		for _, f := range rs.Families {
			rules := append(rs.XTRules(f), rs.XTJumps()...)
			pooled := &Batch{}
			for i := range rules {
				addXT(pooled, f, &rules[i])
			}
			got := pooled.messages(t)
			for i := range rules {
				fresh := &Batch{}
				addXT(fresh, f, &rules[i])
				if want := fresh.messages(t)[0].Data; !slices.Equal(got[i].Data, want) {
					t.Errorf("%s %s rule %q: pooled\n%x\nfresh\n%x", name, f, rules[i].Comment, got[i].Data, want)
				}
			}
		}
	}
}

func checkLaidOut(t *testing.T, fam byte, e expr.Any, what string) {
	t.Helper()
	name := exprName(e)
	data, err := expr.MarshalExprData(fam, e)
	if err != nil {
		t.Fatal(err)
	}
	want, err := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_LIST_ELEM | unix.NLA_F_NESTED,
		Data: must(netlink.MarshalAttributes([]netlink.Attribute{
			{Type: unix.NFTA_EXPR_NAME, Data: []byte(name + "\x00")},
			{Type: unix.NLA_F_NESTED | unix.NFTA_EXPR_DATA, Data: data},
		}))}})
	if err != nil {
		t.Fatal(err)
	}
	var b Batch
	b.expressions(fam, []expr.Any{e})
	if got := b.b[4:]; b.err != nil || !slices.Equal(got, want) {
		t.Errorf("%s: %s laid out\n%x (%v), google/nftables marshals\n%x", what, name, got, b.err, want)
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

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
		_, _, err := encodeXT(iptables.IPv4, c.r(lo))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.what, err, c.want)
		}
	}
}

// The native decoder is the exact inverse of the encoder for every rule and set of every config
// case, through the wire form: what Apply writes, Show reads back as the same model.
func TestNativeRoundTrip(t *testing.T) {
	for name, c := range iptablestest.GoldenConfigs() {
		t.Run(name, func(t *testing.T) {
			want := iptablestest.Build(t, c).NFT()
			ids := map[string]uint32{}
			for i, s := range want.Sets {
				ids[s.Name] = uint32(i + 1)
			}
			for _, c := range want.Chains {
				for _, r := range c.Rules {
					ex, err := nativeExprs(r, ids)
					if err != nil {
						t.Fatal(err)
					}
					read := roundTrip(t, famInet, ex)
					read.comment = r.Comment
					if got := nativeRule(read); got.String() != r.String() {
						t.Errorf("rule round trip:\n got %s\nwant %s", got, r)
					}
				}
			}
			// The sets through the batch: the elements the kernel is given, in the descending
			// order it dumps interval sets in.
			b := &Batch{}
			for i := range want.Sets {
				addSet(b, &want.Sets[i], uint32(i+1))
			}
			if b.err != nil {
				t.Fatal(b.err)
			}
			got := map[string]*set{}
			for _, m := range b.messages(t) {
				ad, _ := attrs(m)
				for ad.Next() {
					if msgType(m) == unix.NFT_MSG_NEWSETELEM && ad.Type() == unix.NFTA_SET_ELEM_LIST_SET {
						name := ad.String()
						if got[name] == nil {
							got[name] = &set{name: name, flags: unix.NFT_SET_CONSTANT | unix.NFT_SET_INTERVAL}
						}
						if err := got[name].decodeElements(m); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			for _, s := range want.Sets {
				st := got[s.Name]
				st.keyType, _ = keyType(s.Type)
				slices.Reverse(st.elems)
				if m := st.model(); m.Body() != s.Body() {
					t.Errorf("set %s round trip:\n got %s\nwant %s", s.Name, m.Body(), s.Body())
				}
			}
		})
	}
}

// Expressions the model does not produce are never mistaken for a match: they show up as
// unrecognized, so a diff reports them.
func TestNativeDecodeRejectsForeignExpressions(t *testing.T) {
	tests := []struct {
		name string
		r    rule
	}{
		{"accept verdict", rule{exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}}},
		{"inverted lookup", rule{exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: "s", Invert: true},
			&expr.Verdict{Kind: expr.VerdictReturn},
		}}},
		{"udp instead of tcp", rule{exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{17}},
			&expr.Verdict{Kind: expr.VerdictReturn},
		}}},
		{"not-equal uid", rule{exprs: []expr.Any{
			&expr.Meta{Key: expr.MetaKeySKUID, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{1, 0, 0, 0}},
			&expr.Verdict{Kind: expr.VerdictReturn},
		}}},
		{"redirect without port flag", rule{exprs: []expr.Any{
			&expr.Immediate{Register: 1, Data: []byte{0x10, 0x2c}}, &expr.Redir{RegisterProtoMin: 1},
		}}},
		{"an expression we do not read", rule{foreign: "log", exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictReturn}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nativeRule(tt.r).String(); !strings.Contains(got, "<unrecognized") {
				t.Errorf("decoded as %q, want it unrecognized", got)
			}
		})
	}
}

// Big sets are split over several element messages, each within a netlink attribute's size and
// holding whole intervals; together they hold every element.
func TestLargeSetIsSplit(t *testing.T) {
	var ivs []iptables.NFTInterval
	for i := range 3000 {
		a := []byte{0x20, 0x01, 0x0d, 0xb8, byte(i >> 8), byte(i), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		ivs = append(ivs, iptables.NFTInterval{First: a, Last: a})
	}
	s := iptables.NFTSet{Name: "big", Type: iptables.NFTIPv6, Elements: iptables.NormalizeIntervals(ivs)}
	b := &Batch{}
	addSet(b, &s, 1)
	if b.err != nil {
		t.Fatal(b.err)
	}
	msgs := b.messages(t)
	if len(msgs) < 3 {
		t.Errorf("%d messages, want the set and several element messages", len(msgs))
	}
	all := set{flags: unix.NFT_SET_CONSTANT | unix.NFT_SET_INTERVAL, keyType: 8}
	for i, m := range msgs {
		if len(m.Data) > 0xffff {
			t.Errorf("message %d (%s) is %d bytes, over a netlink attribute's limit", i, b.what[i], len(m.Data))
		}
		if i > 0 {
			if err := all.decodeElements(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := all.model(); got.Body() != s.Body() {
		t.Errorf("the element messages together do not hold the set")
	}
}

// messages reads the batch's messages back from its buffer, markers left out.
func (b *Batch) messages(t *testing.T) []netlink.Message {
	t.Helper()
	var out []netlink.Message
	for rest := b.b; len(rest) > 0; {
		n := int(binary.NativeEndian.Uint32(rest))
		var m netlink.Message
		if err := m.UnmarshalBinary(rest[:(n+3)&^3]); err != nil {
			t.Fatal(err)
		}
		if m.Header.Type>>8 == unix.NFNL_SUBSYS_NFTABLES {
			out = append(out, m)
		}
		rest = rest[(n+3)&^3:]
	}
	return out
}
