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

// keyTypes are the set key types: the number nft gives the datatype, and the key length. Tables
// here are arrays, never maps, which the CNI plugin would build at every start.
var keyTypes = [...]struct {
	t      iptables.NFTSetType
	id     uint32
	length int
}{{iptables.NFTIPv4, 7, 4}, {iptables.NFTIPv6, 8, 16}, {iptables.NFTPorts, 13, 2}}

func keyType(t iptables.NFTSetType) (id uint32, length int) {
	for _, k := range keyTypes {
		if k.t == t {
			return k.id, k.length
		}
	}
	return 0, 0
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
	out := iptables.NFTSet{Name: s.name, Type: iptables.NFTSetType("type-" + strconv.Itoa(int(s.keyType)))}
	for _, k := range keyTypes {
		if k.id == s.keyType {
			out.Type = k.t
		}
	}
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
	// Sort by key; at equal keys an interval end (of the previous interval) comes before a
	// start. Then each start pairs with the end that follows it (the key after its last one); a
	// start with no end runs to the top of the key space (in a plain set, every element is a
	// single key); stray ends (nft's leading zero marker) carry no interval.
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
		last := e.key
		if s.flags&unix.NFT_SET_INTERVAL != 0 {
			last = bytes.Repeat([]byte{0xff}, len(e.key))
		}
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

// nativeRule maps a rule's expressions back onto the model: the inverse of nativeExprs. What the
// model does not hold shows as an unknown match, so a diff reports it.
func nativeRule(r rule) iptables.NFTRule {
	out := iptables.NFTRule{Comment: r.comment}
	unknown := func(name string) {
		out.Matches = append(out.Matches, iptables.NFTMatch{Kind: iptables.NFTMatchUnknown, Name: name})
	}
	if r.foreign != "" {
		unknown("expression " + r.foreign)
	}
	verdict := false // a verdict of ours, the rule's last statement
	for i := 0; i < len(r.exprs) && !verdict; i++ {
		if m, n := readMatch(r.exprs[i:]); n > 0 {
			out.Matches = append(out.Matches, m)
			i += n - 1
		} else if verdict = readVerdict(&out, r.exprs[i:]); !verdict {
			unknown(fmt.Sprintf("%T%+v", r.exprs[i], r.exprs[i]))
		}
	}
	if !verdict {
		unknown("no verdict of ours")
	}
	return out
}

// readMatch reads the match ex starts with, and says how many expressions it takes (0: none of
// ours): a ct state match, or a meta load and its comparison, which for a protocol dependency
// nft adds may go on with an address's or port's load and its lookup or comparison.
func readMatch(ex []expr.Any) (iptables.NFTMatch, int) {
	if m, ok := readCTState(ex); ok {
		return m, 3
	}
	m, ok := ex[0].(*expr.Meta)
	c, ok2 := next[*expr.Cmp](ex, 1)
	if !ok || !ok2 || m.SourceRegister || c.Op != expr.CmpOpEq || c.Register != m.Register {
		return iptables.NFTMatch{}, 0
	}
	switch l4 := m.Key == expr.MetaKeyL4PROTO && len(c.Data) == 1; {
	case m.Key == expr.MetaKeyNFPROTO && len(c.Data) == 1 && familyOf[c.Data[0]] != "":
		fam := familyOf[c.Data[0]]
		if kind, set, ok := addrLookup(ex, 2, fam); ok {
			return iptables.NFTMatch{Kind: kind, Family: fam, Set: set}, 4
		}
		return iptables.NFTMatch{Kind: iptables.NFTMatchNFProto, Family: fam}, 2
	case l4 && (c.Data[0] == unix.IPPROTO_TCP || c.Data[0] == unix.IPPROTO_UDP):
		if pm, ok := portMatch(ex, 2, c.Data[0] == unix.IPPROTO_TCP); ok {
			return pm, 4
		}
		if c.Data[0] == unix.IPPROTO_TCP {
			return iptables.NFTMatch{Kind: iptables.NFTMatchTCP}, 2
		}
	case m.Key == expr.MetaKeySKUID && len(c.Data) == 4:
		return iptables.NFTMatch{Kind: iptables.NFTMatchSkUID, ID: binary.NativeEndian.Uint32(c.Data)}, 2
	case m.Key == expr.MetaKeySKGID && len(c.Data) == 4:
		return iptables.NFTMatch{Kind: iptables.NFTMatchSkGID, ID: binary.NativeEndian.Uint32(c.Data)}, 2
	case m.Key == expr.MetaKeyOIFNAME && len(c.Data) == unix.IFNAMSIZ:
		return iptables.NFTMatch{Kind: iptables.NFTMatchOIFName, Name: string(bytes.TrimRight(c.Data, "\x00"))}, 2
	case m.Key == expr.MetaKeyIIFNAME && len(c.Data) == unix.IFNAMSIZ:
		return iptables.NFTMatch{Kind: iptables.NFTMatchIIFName, Name: string(bytes.TrimRight(c.Data, "\x00"))}, 2
	}
	return iptables.NFTMatch{}, 0
}

// portMatch matches a transport port's load at ex[i] and the set lookup or comparison after it,
// under a tcp (or else udp) dependency: the port matches nativeExprs writes.
func portMatch(ex []expr.Any, i int, tcp bool) (iptables.NFTMatch, bool) {
	p, ok := next[*expr.Payload](ex, i)
	if !ok || p.Base != expr.PayloadBaseTransportHeader || p.Len != 2 || (p.Offset != 2 && p.Offset != 0) {
		return iptables.NFTMatch{}, false
	}
	if l, ok := next[*expr.Lookup](ex, i+1); ok && tcp && p.Offset == 2 && !l.Invert && l.SourceRegister == p.DestRegister {
		return iptables.NFTMatch{Kind: iptables.NFTMatchDPortSet, Set: l.SetName}, true
	}
	pc, ok := next[*expr.Cmp](ex, i+1)
	if !ok || pc.Op != expr.CmpOpEq || pc.Register != p.DestRegister || len(pc.Data) != 2 {
		return iptables.NFTMatch{}, false
	}
	kind := iptables.NFTMatchUDPDPort
	switch {
	case tcp && p.Offset == 2:
		kind = iptables.NFTMatchTCPDPort
	case !tcp && p.Offset == 0:
		kind = iptables.NFTMatchUDPSPort
	case tcp:
		return iptables.NFTMatch{}, false
	}
	return iptables.NFTMatch{Kind: kind, ID: uint32(binary.BigEndian.Uint16(pc.Data))}, true
}

// readCTState reads a ct state match at the start of ex: ct load state, bitwise mask, cmp neq 0.
func readCTState(ex []expr.Any) (iptables.NFTMatch, bool) {
	ct, ok := ex[0].(*expr.Ct)
	bw, ok1 := next[*expr.Bitwise](ex, 1)
	c, ok2 := next[*expr.Cmp](ex, 2)
	if ok && ok1 && ok2 && !ct.SourceRegister && ct.Key == expr.CtKeySTATE && bw.Len == 4 && len(bw.Mask) == 4 &&
		len(bw.Xor) == 4 && isZero(bw.Xor) && bw.SourceRegister == ct.Register && bw.DestRegister == ct.Register &&
		c.Op == expr.CmpOpNeq && c.Register == ct.Register && len(c.Data) == 4 && isZero(c.Data) {
		return iptables.NFTMatch{Kind: iptables.NFTMatchCTState, ID: binary.NativeEndian.Uint32(bw.Mask)}, true
	}
	return iptables.NFTMatch{}, false
}

// readVerdict reads tail, the rule's last expressions, as one of our verdicts into out: return or
// drop; an immediate port and a redirect to it; an immediate zone and ct zone set; an immediate
// port, tproxy, an immediate mark, meta mark set, accept.
func readVerdict(out *iptables.NFTRule, tail []expr.Any) bool {
	v, _ := tail[0].(*expr.Verdict)
	im, _ := tail[0].(*expr.Immediate)
	switch {
	case len(tail) == 1 && v != nil && (v.Kind == expr.VerdictReturn || v.Kind == expr.VerdictDrop):
		if v.Kind == expr.VerdictDrop {
			out.Verdict = iptables.NFTDrop
		}
		return true
	case len(tail) == 2 && im != nil && len(im.Data) == 2:
		if rd, ok := tail[1].(*expr.Redir); ok && rd.RegisterProtoMin == im.Register &&
			(rd.RegisterProtoMax == 0 || rd.RegisterProtoMax == im.Register) && rd.Flags == unix.NF_NAT_RANGE_PROTO_SPECIFIED {
			out.Verdict, out.RedirectPort = iptables.NFTRedirect, binary.BigEndian.Uint16(im.Data)
			return true
		}
		if ct, ok := tail[1].(*expr.Ct); ok && ct.SourceRegister && ct.Key == expr.CtKeyZONE && ct.Register == im.Register {
			out.Verdict, out.Zone = iptables.NFTZone, binary.NativeEndian.Uint16(im.Data)
			return true
		}
	case len(tail) == 5 && im != nil:
		tp, ok1 := tail[1].(*expr.TProxy)
		mk, ok2 := tail[2].(*expr.Immediate)
		ms, ok3 := tail[3].(*expr.Meta)
		ac, ok4 := tail[4].(*expr.Verdict)
		if !ok1 || !ok2 || !ok3 || !ok4 || len(im.Data) != 2 || tp.RegPort != im.Register || tp.RegAddr != 0 || len(mk.Data) != 4 ||
			!ms.SourceRegister || ms.Key != expr.MetaKeyMARK || ms.Register != mk.Register || ac.Kind != expr.VerdictAccept ||
			(tp.Family != unix.NFPROTO_UNSPEC && familyOf[tp.Family] == "") {
			return false
		}
		out.Verdict, out.RedirectPort, out.Mark = iptables.NFTTPROXY, binary.BigEndian.Uint16(im.Data), binary.NativeEndian.Uint32(mk.Data)
		out.TPROXYFamily = familyOf[tp.Family]
		return true
	}
	return false
}

// addrLookup matches an address load and a lookup of it, at ex[i:], for family fam.
func addrLookup(ex []expr.Any, i int, fam iptables.Family) (iptables.NFTMatchKind, string, bool) {
	if i+1 >= len(ex) {
		return 0, "", false
	}
	p, ok := ex[i].(*expr.Payload)
	if !ok || p.Base != expr.PayloadBaseNetworkHeader {
		return 0, "", false
	}
	l, ok := ex[i+1].(*expr.Lookup)
	if !ok || l.Invert || l.SourceRegister != p.DestRegister {
		return 0, "", false
	}
	for _, src := range []bool{true, false} {
		if off, ln := addrOffset(fam, src); p.Offset == off && p.Len == ln {
			if src {
				return iptables.NFTMatchSAddrSet, l.SetName, true
			}
			return iptables.NFTMatchDAddrSet, l.SetName, true
		}
	}
	return 0, "", false
}

// familyOf is the iptables family of an nf_tables family, "" for others.
var familyOf = [256]iptables.Family{famIP: iptables.IPv4, famIP6: iptables.IPv6}

// uint16At reads a big-endian integer of exactly that size, and 0 from anything else.
func uint16At(b []byte) uint16 {
	if len(b) != 2 {
		return 0
	}
	return binary.BigEndian.Uint16(b)
}
