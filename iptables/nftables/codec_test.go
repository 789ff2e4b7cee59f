package nftables

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// The decoder is the exact inverse of the encoder for every rule and set of every config case:
// what Apply writes, Show reads back as the same model. No root needed.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	for name, mod := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			want := build(t, mod).NFT()
			ids := map[string]uint32{}
			for i, s := range want.Sets {
				ids[s.Name] = uint32(i + 1)
			}
			for _, c := range want.Chains {
				for _, r := range c.Rules {
					ex, err := ruleExprs(r, ids)
					if err != nil {
						t.Fatal(err)
					}
					got := decodeRule(&nftables.Rule{Exprs: ex, UserData: commentData(r.Comment)})
					if got.String() != r.String() {
						t.Errorf("rule round trip:\n got %s\nwant %s", got, r)
					}
				}
			}
			for _, s := range want.Sets {
				elems := intervalElements(s.Elements, s.Type.KeyLen())
				// The kernel dumps interval sets in descending key order.
				slices.Reverse(elems)
				got := decodeSet(&nftables.Set{Name: s.Name, KeyType: nftables.SetDatatype{Name: string(s.Type)}, Constant: true, Interval: true}, elems)
				if got.Body() != s.Body() {
					t.Errorf("set %s round trip:\n got %s\nwant %s", s.Name, got.Body(), s.Body())
				}
			}
		})
	}
}

func commentData(c string) []byte {
	return userdata.AppendString(nil, userdata.TypeComment, c)
}

// Expressions the model does not produce are never mistaken for a match: they show up as
// unrecognized, so a diff reports them.
func TestDecodeRejectsForeignExpressions(t *testing.T) {
	tests := []struct {
		name string
		ex   []expr.Any
		want string
	}{
		{"accept verdict", []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}, "<unrecognized"},
		{"inverted lookup", []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			&expr.Lookup{SourceRegister: 1, SetName: "s", Invert: true},
			&expr.Verdict{Kind: expr.VerdictReturn},
		}, "<unrecognized"},
		{"udp instead of tcp", []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1}, &expr.Cmp{Register: 1, Data: []byte{17}},
			&expr.Verdict{Kind: expr.VerdictReturn},
		}, "<unrecognized"},
		{"not-equal uid", []expr.Any{
			&expr.Meta{Key: expr.MetaKeySKUID, Register: 1}, &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{1, 0, 0, 0}},
			&expr.Verdict{Kind: expr.VerdictReturn},
		}, "<unrecognized"},
		{"redirect without port flag", []expr.Any{
			&expr.Immediate{Register: 1, Data: []byte{0x10, 0x2c}}, &expr.Redir{RegisterProtoMin: 1},
		}, "<unrecognized"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decodeRule(&nftables.Rule{Exprs: tt.ex}).String(); !strings.Contains(got, tt.want) {
				t.Errorf("decoded as %q, want it to contain %q", got, tt.want)
			}
		})
	}
}

// Big sets are split over several element messages, each within a netlink attribute's size.
func TestLargeSetIsSplit(t *testing.T) {
	var ivs []iptables.NFTInterval
	for i := range 3000 {
		a := []byte{0x20, 0x01, 0x0d, 0xb8, byte(i >> 8), byte(i), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}
		ivs = append(ivs, iptables.NFTInterval{First: a, Last: a})
	}
	var b batch
	b.addSet([]byte("t\x00"), iptables.NFTSet{Name: "big", Type: iptables.NFTIPv6, Elements: iptables.NormalizeIntervals(ivs)}, 1)
	if b.err != nil {
		t.Fatal(b.err)
	}
	if len(b.msgs) < 3 {
		t.Errorf("%d messages, want the set and several element messages", len(b.msgs))
	}
	for i, m := range b.msgs {
		if len(m.Data) > 0xffff {
			t.Errorf("message %d (%s) is %d bytes, over a netlink attribute's limit", i, b.desc[i], len(m.Data))
		}
	}
}

// The hand-laid element encoding is byte for byte what the generic attribute marshaller makes.
func TestAppendElemMatchesMarshal(t *testing.T) {
	for _, e := range []nftables.SetElement{
		{Key: []byte{0x10, 0x5e}},
		{Key: []byte{0x10, 0x60}, IntervalEnd: true},
		{Key: []byte{192, 0, 2, 0}, IntervalEnd: true},
		{Key: make([]byte, 16)},
	} {
		key, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NFTA_DATA_VALUE, Data: e.Key}})
		item := []netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_KEY, Data: key}}
		if e.IntervalEnd {
			item = append(item, netlink.Attribute{Type: unix.NFTA_SET_ELEM_FLAGS, Data: u32(unix.NFT_SET_ELEM_INTERVAL_END)})
		}
		inner, _ := netlink.MarshalAttributes(item)
		want, _ := netlink.MarshalAttributes([]netlink.Attribute{{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: inner}})
		if got := appendElem(nil, e); !bytes.Equal(got, want) {
			t.Errorf("element %x end=%v:\n got %x\nwant %x", e.Key, e.IntervalEnd, got, want)
		}
		if got := len(appendElem(nil, e)); e.IntervalEnd && got != elemSize(len(e.Key)) {
			t.Errorf("elemSize(%d) = %d, encoded %d", len(e.Key), elemSize(len(e.Key)), got)
		}
	}
}
