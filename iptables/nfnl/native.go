package nfnl

// The native encoding: the builder's inet table (iptables.NFTTable) as sets, chains and rules,
// each rule exactly the expressions nft compiles for the same statement (with the protocol
// dependencies nft adds), and the inverse, so a table read back compares with what NFT() expects.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// keyTypes are the set key types: the number nft gives the datatype, and the key length.
var keyTypes = map[iptables.NFTSetType][2]int{
	iptables.NFTIPv4: {7, 4}, iptables.NFTIPv6: {8, 16}, iptables.NFTPorts: {13, 2},
}

func keyType(t iptables.NFTSetType) (id uint32, length int) {
	return uint32(keyTypes[t][0]), keyTypes[t][1]
}

func keyTypeName(id uint32) iptables.NFTSetType {
	for t, k := range keyTypes {
		if uint32(k[0]) == id {
			return t
		}
	}
	return iptables.NFTSetType("type-" + strconv.FormatUint(uint64(id), 10))
}

// nativeExprs translates a rule of the model into expressions, exactly as nft compiles the same
// statement. setIDs are the batch's ids of the sets the rule looks up.
func nativeExprs(r iptables.NFTRule, setIDs map[string]uint32) ([]expr.Any, error) {
	var out []expr.Any
	var err error
	for _, m := range r.Matches {
		if out, err = appendNativeMatch(out, m, setIDs); err != nil {
			return nil, err
		}
	}
	return appendNativeVerdict(out, r)
}

// appendNativeMatch appends the expressions of one match, with the dependencies nft adds for it.
func appendNativeMatch(out []expr.Any, m iptables.NFTMatch, setIDs map[string]uint32) ([]expr.Any, error) {
	switch m.Kind {
	case iptables.NFTMatchNFProto:
		return appendMetaCmp(out, expr.MetaKeyNFPROTO, []byte{xtFamily(m.Family)}), nil
	case iptables.NFTMatchTCP:
		return appendMetaCmp(out, expr.MetaKeyL4PROTO, []byte{unix.IPPROTO_TCP}), nil
	case iptables.NFTMatchDPortSet:
		out = append(appendMetaCmp(out, expr.MetaKeyL4PROTO, []byte{unix.IPPROTO_TCP}), dportLoad)
		return appendLookup(out, m.Set, setIDs)
	case iptables.NFTMatchSAddrSet, iptables.NFTMatchDAddrSet:
		out = appendMetaCmp(out, expr.MetaKeyNFPROTO, []byte{xtFamily(m.Family)})
		off, ln := addrOffset(m.Family, m.Kind == iptables.NFTMatchSAddrSet)
		out = append(out, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: ln})
		return appendLookup(out, m.Set, setIDs)
	case iptables.NFTMatchSkUID:
		return appendMetaCmp(out, expr.MetaKeySKUID, binary.NativeEndian.AppendUint32(nil, m.ID)), nil
	case iptables.NFTMatchSkGID:
		return appendMetaCmp(out, expr.MetaKeySKGID, binary.NativeEndian.AppendUint32(nil, m.ID)), nil
	case iptables.NFTMatchOIFName, iptables.NFTMatchIIFName:
		if len(m.Name) >= unix.IFNAMSIZ {
			return nil, fmt.Errorf("interface name %q too long", m.Name)
		}
		name := make([]byte, unix.IFNAMSIZ)
		copy(name, m.Name)
		key := expr.MetaKeyOIFNAME
		if m.Kind == iptables.NFTMatchIIFName {
			key = expr.MetaKeyIIFNAME
		}
		return appendMetaCmp(out, key, name), nil
	case iptables.NFTMatchTCPDPort, iptables.NFTMatchUDPDPort, iptables.NFTMatchUDPSPort:
		if m.ID == 0 || m.ID > 65535 {
			return nil, fmt.Errorf("match %s: not a port", m)
		}
		proto, load := byte(unix.IPPROTO_UDP), dportLoad
		if m.Kind == iptables.NFTMatchTCPDPort {
			proto = unix.IPPROTO_TCP
		} else if m.Kind == iptables.NFTMatchUDPSPort {
			load = sportLoad
		}
		out = appendMetaCmp(out, expr.MetaKeyL4PROTO, []byte{proto})
		return append(out, load, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: port(uint16(m.ID))}), nil
	case iptables.NFTMatchCTState:
		// ct state: the state bit of the connection, masked, not zero.
		return append(out, &expr.Ct{Key: expr.CtKeySTATE, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: binary.NativeEndian.AppendUint32(nil, m.ID), Xor: make([]byte, 4)},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)}), nil
	}
	return nil, fmt.Errorf("match %s cannot be written", m)
}

// appendMetaCmp appends a meta load of key and its comparison with data: most matches' start.
func appendMetaCmp(out []expr.Any, key expr.MetaKey, data []byte) []expr.Any {
	return append(out, &expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data})
}

// appendLookup appends the lookup of the register in set, by the batch's id for it.
func appendLookup(out []expr.Any, set string, setIDs map[string]uint32) ([]expr.Any, error) {
	id, ok := setIDs[set]
	if !ok {
		return nil, fmt.Errorf("set %q is not in the table", set)
	}
	return append(out, &expr.Lookup{SourceRegister: 1, SetName: set, SetID: id}), nil
}

// appendNativeVerdict appends the rule's verdict statement.
func appendNativeVerdict(out []expr.Any, r iptables.NFTRule) ([]expr.Any, error) {
	switch {
	case r.Verdict == iptables.NFTReturn:
		out = append(out, &expr.Verdict{Kind: expr.VerdictReturn})
	case r.Verdict == iptables.NFTDrop:
		out = append(out, &expr.Verdict{Kind: expr.VerdictDrop})
	case r.Verdict == iptables.NFTRedirect && r.RedirectPort != 0:
		out = append(out, &expr.Immediate{Register: 1, Data: port(r.RedirectPort)},
			&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED})
	case r.Verdict == iptables.NFTZone && r.Zone != 0:
		// ct zone set: the zone, a u16 in host order, from a register.
		out = append(out, &expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint16(nil, r.Zone)},
			&expr.Ct{Key: expr.CtKeyZONE, Register: 1, SourceRegister: true})
	case r.Verdict == iptables.NFTTPROXY && r.RedirectPort != 0:
		fam := byte(unix.NFPROTO_UNSPEC)
		if r.TPROXYFamily != "" {
			fam = xtFamily(r.TPROXYFamily)
		}
		out = append(out, &expr.Immediate{Register: 1, Data: port(r.RedirectPort)},
			&expr.TProxy{Family: fam, RegPort: 1},
			&expr.Immediate{Register: 1, Data: binary.NativeEndian.AppendUint32(nil, r.Mark)},
			&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
			&expr.Verdict{Kind: expr.VerdictAccept})
	case r.Verdict == iptables.NFTRedirect || r.Verdict == iptables.NFTTPROXY:
		return nil, errors.New("redirect to port 0")
	case r.Verdict == iptables.NFTZone:
		return nil, errors.New("ct zone set 0")
	default:
		return nil, fmt.Errorf("unknown verdict %d", r.Verdict)
	}
	return out, nil
}

func isZero(b []byte) bool {
	return bytes.Count(b, []byte{0}) == len(b)
}

// nativeTable maps our table, read in detail, onto the builder's model. comment is the table's.
func nativeTable(t *ruleTable, comment string) *iptables.NFTTable {
	out := &iptables.NFTTable{Comment: comment}
	for _, s := range t.sets {
		out.Sets = append(out.Sets, s.model())
	}
	for _, c := range t.chains {
		ch := iptables.NFTChain{Name: c.name, Priority: int(c.priority)}
		if c.base {
			ch.Hook = iptables.HookByNumber(c.hook)
		}
		if c.typ != "nat" {
			ch.Type = cmp.Or(c.typ, "none")
		}
		if c.policy != nfAccept {
			ch.Policy = "drop"
		}
		for _, r := range t.rules[c.name] {
			ch.Rules = append(ch.Rules, nativeRule(r))
		}
		out.Chains = append(out.Chains, ch)
	}
	return out
}

// model turns a set read back into the model: its interval set elements back into inclusive
// intervals.
func (s set) model() iptables.NFTSet {
	out := iptables.NFTSet{Name: s.name, Type: keyTypeName(s.keyType)}
	const want = unix.NFT_SET_CONSTANT | unix.NFT_SET_INTERVAL
	if s.flags != want {
		var f []string
		for _, x := range []struct {
			bit  uint32
			name string
		}{{unix.NFT_SET_CONSTANT, "constant"}, {unix.NFT_SET_INTERVAL, "interval"}, {unix.NFT_SET_MAP, "map"},
			{unix.NFT_SET_ANONYMOUS, "anonymous"}, {unix.NFT_SET_TIMEOUT, "timeout"}} {
			if s.flags&x.bit != 0 {
				f = append(f, x.name)
			}
		}
		out.Flags = cmp.Or(strings.Join(f, ","), "none")
	}
	if s.flags&unix.NFT_SET_INTERVAL == 0 { // a plain set: every element is a single key
		for _, e := range s.elems {
			out.Elements = append(out.Elements, iptables.NFTInterval{First: e.key, Last: e.key})
		}
		out.Elements = iptables.NormalizeIntervals(out.Elements)
		return out
	}
	// Sort by key; at equal keys an interval end (of the previous interval) comes before a
	// start. Then each start pairs with the end that follows it (the key after its last one); a
	// start with no end runs to the top of the key space; stray ends (nft's leading zero marker)
	// carry no interval.
	sorted := slices.Clone(s.elems)
	sort.SliceStable(sorted, func(i, j int) bool {
		if c := bytes.Compare(sorted[i].key, sorted[j].key); c != 0 {
			return c < 0
		}
		return sorted[i].end && !sorted[j].end
	})
	for i := 0; i < len(sorted); i++ {
		e := sorted[i]
		if e.end {
			continue
		}
		last := bytes.Repeat([]byte{0xff}, len(e.key))
		if i+1 < len(sorted) && sorted[i+1].end {
			last = decrement(sorted[i+1].key)
			i++
		}
		out.Elements = append(out.Elements, iptables.NFTInterval{First: e.key, Last: last})
	}
	out.Elements = iptables.NormalizeIntervals(out.Elements)
	return out
}

func decrement(k []byte) []byte {
	out := slices.Clone(k)
	for i := len(out) - 1; i >= 0; i-- {
		out[i]--
		if out[i] != 0xff {
			break
		}
	}
	return out
}

// nativeRule maps a rule's expressions back onto the model: the inverse of nativeExprs. Each
// match and the verdict count only if nativeExprs writes exactly the expressions read for them;
// anything else reads back as an NFTMatchUnknown, so it shows in a diff.
func nativeRule(r rule) iptables.NFTRule {
	out := iptables.NFTRule{Comment: r.comment}
	unknown := func(what string) {
		out.Matches = append(out.Matches, iptables.NFTMatch{Kind: iptables.NFTMatchUnknown, Name: what})
	}
	if r.foreign != "" {
		unknown("expression " + r.foreign)
	}
	for ex := r.exprs; len(ex) > 0; {
		if v, ok := nativeVerdict(ex); ok { // a verdict is the rule's last statement
			v.Comment, v.Matches = out.Comment, out.Matches
			return v
		}
		if m, n := nativeMatch(ex); n > 0 {
			out.Matches, ex = append(out.Matches, m), ex[n:]
			continue
		}
		unknown(fmt.Sprintf("%T%+v", ex[0], ex[0]))
		ex = ex[1:]
	}
	unknown("no verdict of ours")
	return out
}

// nativeMatch reads the match of ours that starts ex, and how many expressions it takes (0 for
// none): it tries every kind, with the parameters found where that kind's encoding holds them,
// the longest encodings (those with a protocol dependency) first.
func nativeMatch(ex []expr.Any) (iptables.NFTMatch, int) {
	d1, _ := cmpData(ex, 1)
	d3, _ := cmpData(ex, 3)
	var fam iptables.Family
	if len(d1) == 1 {
		fam = familyOf(d1[0])
	}
	var set string
	var setID uint32
	if l, ok := next[*expr.Lookup](ex, 3); ok {
		set, setID = l.SetName, l.SetID
	}
	var mask []byte
	if b, ok := next[*expr.Bitwise](ex, 1); ok {
		mask = b.Mask
	}
	ids := map[string]uint32{set: setID}
	port := uint32(uint16At(d3, binary.BigEndian))
	name := string(bytes.TrimRight(d1, "\x00"))
	for _, m := range []iptables.NFTMatch{
		{Kind: iptables.NFTMatchDPortSet, Set: set},
		{Kind: iptables.NFTMatchSAddrSet, Family: fam, Set: set},
		{Kind: iptables.NFTMatchDAddrSet, Family: fam, Set: set},
		{Kind: iptables.NFTMatchTCPDPort, ID: port},
		{Kind: iptables.NFTMatchUDPDPort, ID: port},
		{Kind: iptables.NFTMatchUDPSPort, ID: port},
		{Kind: iptables.NFTMatchCTState, ID: uint32At(mask)},
		{Kind: iptables.NFTMatchNFProto, Family: fam},
		{Kind: iptables.NFTMatchTCP},
		{Kind: iptables.NFTMatchSkUID, ID: uint32At(d1)},
		{Kind: iptables.NFTMatchSkGID, ID: uint32At(d1)},
		{Kind: iptables.NFTMatchOIFName, Name: name},
		{Kind: iptables.NFTMatchIIFName, Name: name},
	} {
		want, err := appendNativeMatch(nil, m, ids)
		if err == nil && len(want) <= len(ex) && sameExprs(famInet, want, ex[:len(want)]) {
			return m, len(want)
		}
	}
	return iptables.NFTMatch{}, 0
}

// nativeVerdict reads ex, the rule's last expressions, as one of our verdicts, with the port,
// zone, mark and family found where their encodings hold them.
func nativeVerdict(ex []expr.Any) (iptables.NFTRule, bool) {
	var port, zone uint16
	if im, ok := next[*expr.Immediate](ex, 0); ok {
		port, zone = uint16At(im.Data, binary.BigEndian), uint16At(im.Data, binary.NativeEndian)
	}
	var mark uint32
	if im, ok := next[*expr.Immediate](ex, 2); ok {
		mark = uint32At(im.Data)
	}
	var fam iptables.Family
	if tp, ok := next[*expr.TProxy](ex, 1); ok {
		fam = familyOf(tp.Family)
	}
	for _, v := range []iptables.NFTRule{
		{Verdict: iptables.NFTReturn},
		{Verdict: iptables.NFTDrop},
		{Verdict: iptables.NFTRedirect, RedirectPort: port},
		{Verdict: iptables.NFTZone, Zone: zone},
		{Verdict: iptables.NFTTPROXY, RedirectPort: port, Mark: mark, TPROXYFamily: fam},
	} {
		if want, err := appendNativeVerdict(nil, v); err == nil && sameExprs(famInet, want, ex) {
			return v, true
		}
	}
	return iptables.NFTRule{}, false
}

// uint16At and uint32At read an integer of exactly that size, and 0 from anything else.
func uint16At(b []byte, order binary.ByteOrder) uint16 {
	if len(b) != 2 {
		return 0
	}
	return order.Uint16(b)
}

func uint32At(b []byte) uint32 {
	if len(b) != 4 {
		return 0
	}
	return binary.NativeEndian.Uint32(b)
}

// familyOf is the iptables family of an nf_tables family number, or "" for another.
func familyOf(b byte) iptables.Family {
	return map[byte]iptables.Family{famIP: iptables.IPv4, famIP6: iptables.IPv6}[b]
}
