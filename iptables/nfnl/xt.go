package nfnl

// The iptables-nft encoding: one iptables.XTRule as the nf_tables expressions iptables-nft 1.8.9
// builds for the same iptables-restore line (found by dumping what iptables-nft-restore wrote).
// Interface, protocol, address and tcp/udp port matches and DROP and RETURN are native
// expressions; the owner, multiport, conntrack and comment matches and the REDIRECT, TPROXY and
// CT targets are xtables extensions run by nft_compat, each with its revision and C struct as
// info (IPv4 REDIRECT is revision 0, the compat struct). Every rule carries a counter before its
// verdict, as iptables-nft's do. decodeXT is the inverse, strict by construction: a rule read
// back is ours only if encoding what it decodes to gives back exactly the expressions read.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// Extension revisions and info sizes, as iptables-nft 1.8.9 sends them. The info is the
// extension's C struct, padded to 8 bytes (XT_ALIGN), in host byte order except where the struct
// itself says network order.
const (
	ownerRev       = 1              // xt_owner_match_info
	ownerInfoLen   = 24             // 4 u32 + 2 u8, padded
	multiportRev   = 1              // xt_multiport_v1
	multiportLen   = 48             // flags, count, ports[15], pflags[15], invert
	redirectRev    = 0              // nf_nat_ipv4_multi_range_compat (ip), nf_nat_range (ip6)
	commentRev     = 0              // xt_comment_info
	conntrackRev   = 3              // xt_conntrack_mtinfo3
	tproxyRev      = 1              // xt_tproxy_target_info_v1
	tproxyInfoLen  = 32             // mark_mask, mark_value, laddr, lport, padded
	ctRev          = 2              // xt_ct_target_info_v1
	ctInfoLen      = 72             // flags, zone, two event masks, helper, timeout, a pointer
	xtCTState      = 1              // XT_CONNTRACK_STATE
	xtOwnerUID     = 1              // XT_OWNER_UID
	xtOwnerGID     = 2              // XT_OWNER_GID
	xtMultiportDst = 1              // XT_MULTIPORT_DESTINATION
	maxMultiport   = 15             // XT_MULTI_PORTS
	nfAccept       = 1              // NF_ACCEPT, the built-in chains' policy
	reg1           = unix.NFT_REG_1 // the only data register iptables-nft uses
)

// The expressions every rule, or many, hold alike. encodeXT hands out these, shared, so that each
// is marshalled once per process and family (Batch.expressions): with a thousand rules,
// marshalling was most of the time it took to lay a batch out. Nothing modifies them.
var (
	tcpMeta     = &expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1}
	tcpCmp      = &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_TCP}}
	oifnameMeta = &expr.Meta{Key: expr.MetaKeyOIFNAME, Register: reg1}
	dportLoad   = &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	counter     = &expr.Counter{}
	returnExpr  = &expr.Verdict{Kind: expr.VerdictReturn}
	udpCmp      = &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.IPPROTO_UDP}}
	iifnameMeta = &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1}
	sportLoad   = &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 2}
	dropExpr    = &expr.Verdict{Kind: expr.VerdictDrop}
	singles     = [...]expr.Any{tcpMeta, tcpCmp, oifnameMeta, dportLoad, counter, returnExpr, udpCmp, iifnameMeta, sportLoad, dropExpr}
	// addrLoads are the loads of the first n bytes of an address: [index in addrOffsets][n].
	addrOffsets   = [...]uint32{8, 12, 16, 24} // where the two headers hold the addresses (addrOffset)
	addrLoadsOnce sync.Once                    // fills addrLoadTable on first use, not in a package initialiser
	addrLoadTable [len(addrOffsets)][17]*expr.Payload
	// sharedWire holds the shared expressions' marshalled data, filled as they are first used:
	// [index in wireFamilies][sharedSlot].
	wireFamilies = [...]byte{famIP, famIP6, famInet}
	sharedWire   [len(wireFamilies)][len(singles) + len(addrOffsets)*17]atomic.Pointer[[]byte]
)

func addrLoads() *[len(addrOffsets)][17]*expr.Payload {
	addrLoadsOnce.Do(func() {
		for i, off := range addrOffsets {
			for n := uint32(1); n <= 16; n++ {
				addrLoadTable[i][n] = &expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n}
			}
		}
	})
	return &addrLoadTable
}

func addrLoad(off, n uint32) *expr.Payload {
	return addrLoads()[slices.Index(addrOffsets[:], off)][n]
}

// sharedSlot numbers the expressions above, and is -1 for every other.
func sharedSlot(e expr.Any) int {
	if i := slices.Index(singles[:], e); i >= 0 {
		return i
	}
	if p, ok := e.(*expr.Payload); ok && p.Len >= 1 && p.Len <= 16 {
		if i := slices.Index(addrOffsets[:], p.Offset); i >= 0 && addrLoads()[i][p.Len] == p {
			return len(singles) + 17*i + int(p.Len)
		}
	}
	return -1
}

// xtFamily is the nf_tables family of an iptables family: iptables-nft's "ip" and "ip6".
func xtFamily(f iptables.Family) byte {
	if f == iptables.IPv6 {
		return famIP6
	}
	return famIP
}

// encodeXT returns the expressions of r for family f, and the layer-4 protocol its xtables
// extensions may assume (NFTA_RULE_COMPAT_PROTO: multiport refuses a rule that does not say tcp).
func encodeXT(f iptables.Family, r iptables.XTRule) ([]expr.Any, uint32, error) {
	return appendXT(make([]expr.Any, 0, 8), &exprPool{}, f, r)
}

// exprPool lends the expressions of one rule of its own (comparisons, addresses, the comment)
// while it is laid out: a batch marshals each rule before it encodes the next, which reuses them
// (a thousand rules allocated 100 KB of expressions that lived for one rule each).
type exprPool struct {
	cmps    [4]expr.Cmp // an interface, two addresses and a port at most
	ncmp    int
	addrs   [2][16]byte
	naddr   int
	match   expr.Match
	comment xt.Comment
}

func (p *exprPool) cmp(data []byte) *expr.Cmp {
	if p == nil || p.ncmp == len(p.cmps) {
		return &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: data}
	}
	c := &p.cmps[p.ncmp]
	p.ncmp++
	*c = expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: data}
	return c
}

// addr returns the bytes of a, as a slice. (A nil pool allocates.)
func (p *exprPool) addr(a netip.Addr) []byte {
	if p == nil || p.naddr == len(p.addrs) {
		return a.AsSlice()
	}
	p.naddr++
	b, _ := a.AppendBinary(p.addrs[p.naddr-1][:0]) // a masked prefix's address has no zone
	return b
}

// appendXT is encodeXT appending to out, with the expressions of the rule's own from pool.
func appendXT(out []expr.Any, pool *exprPool, f iptables.Family, r iptables.XTRule) ([]expr.Any, uint32, error) {
	pool.ncmp, pool.naddr = 0, 0
	out, proto, err := appendXTMatches(out, pool, f, r)
	if err != nil {
		return nil, 0, err
	}
	if len(r.Comment) >= xt.CommentSize {
		return nil, 0, fmt.Errorf("comment %q is longer than iptables allows (%d bytes)", r.Comment, xt.CommentSize-1)
	}
	pool.comment = xt.Comment(r.Comment)
	pool.match = expr.Match{Name: "comment", Rev: commentRev, Info: &pool.comment}
	out = append(out, &pool.match, counter)
	if out, err = appendXTTarget(out, f, r); err != nil {
		return nil, 0, err
	}
	return out, proto, nil
}

// appendXTMatches appends what the rule matches, in iptables' order, and returns the transport
// protocol it names (0 for none).
func appendXTMatches(out []expr.Any, pool *exprPool, f iptables.Family, r iptables.XTRule) ([]expr.Any, uint32, error) {
	if r.InInterface != "" {
		out = append(out, iifnameMeta, pool.cmp(ifname(r.InInterface)))
	}
	if r.OutInterface != "" {
		out = append(out, oifnameMeta, pool.cmp(ifname(r.OutInterface)))
	}
	var proto uint32
	switch {
	case r.TCP && r.UDP:
		return nil, 0, errors.New("both -p tcp and -p udp")
	case r.TCP:
		proto = unix.IPPROTO_TCP
		out = append(out, tcpMeta, tcpCmp)
	case r.UDP:
		proto = unix.IPPROTO_UDP
		out = append(out, tcpMeta, udpCmp) // the same l4proto load
	}
	for i, p := range [2]netip.Prefix{r.Source, r.Destination} {
		if !p.IsValid() || p.Bits() == 0 {
			continue // what iptables does with 0.0.0.0/0: no match at all
		}
		if p.Addr().Is4() != (f == iptables.IPv4) {
			return nil, 0, fmt.Errorf("address %s in an %s rule", p, f)
		}
		out = addrMatch(out, pool, f, p, i == 0)
	}
	for i, id := range [2]*uint32{r.UIDOwner, r.GIDOwner} {
		if what := [2]byte{xtOwnerUID, xtOwnerGID}[i]; id != nil {
			out = append(out, &expr.Match{Name: "owner", Rev: ownerRev, Info: new(ownerInfo(what, *id))})
		}
	}
	if len(r.MultiportDPorts) > 0 {
		info, err := multiportInfo(r.MultiportDPorts)
		if err != nil {
			return nil, 0, err
		}
		out = append(out, &expr.Match{Name: "multiport", Rev: multiportRev, Info: &info})
	}
	out, err := appendXTPorts(out, pool, proto, r)
	if err != nil {
		return nil, 0, err
	}
	if r.CTState != "" {
		i := slices.IndexFunc(ctStateMasks[:], func(m ctStateMask) bool { return m.states == r.CTState })
		if i < 0 {
			return nil, 0, fmt.Errorf("conntrack state %q is not one we match", r.CTState)
		}
		mask := ctStateMasks[i].mask
		out = append(out, &expr.Match{Name: "conntrack", Rev: conntrackRev, Info: conntrackInfo(f, mask)})
	}
	return out, proto, nil
}

// appendXTPorts appends the source and destination port matches, which need a protocol.
func appendXTPorts(out []expr.Any, pool *exprPool, proto uint32, r iptables.XTRule) ([]expr.Any, error) {
	// The ports: the transport header's bytes 0 and 1 (source), 2 and 3 (destination).
	for i, p := range [2]iptables.PortRange{r.SPort, r.DPort} {
		if p.First == 0 {
			continue
		}
		if proto == 0 {
			return nil, errors.New("a port without -p tcp or -p udp")
		}
		out = append(out, [2]*expr.Payload{sportLoad, dportLoad}[i])
		first, last := port(p.First), port(p.Last)
		if p.First == p.Last {
			out = append(out, pool.cmp(first))
		} else {
			out = append(out, &expr.Range{Op: expr.CmpOpEq, Register: reg1, FromData: first, ToData: last})
		}
	}
	return out, nil
}

// appendXTTarget appends the rule's verdict or target.
func appendXTTarget(out []expr.Any, f iptables.Family, r iptables.XTRule) ([]expr.Any, error) {
	switch r.Target {
	case iptables.TargetReturn:
		return append(out, returnExpr), nil
	case iptables.TargetDrop:
		return append(out, dropExpr), nil
	case iptables.TargetRedirect:
		if r.ToPort == 0 {
			return nil, errors.New("redirect to port 0")
		}
		return append(out, &expr.Target{Name: "REDIRECT", Rev: redirectRev, Info: redirectInfo(f, r.ToPort)}), nil
	case iptables.TargetTPROXY:
		if r.ToPort == 0 || !r.OnIP.IsUnspecified() || r.OnIP.Is4() != (f == iptables.IPv4) {
			return nil, fmt.Errorf("TPROXY to %s port %d: not the family's unspecified address and a port", r.OnIP, r.ToPort)
		}
		info := tproxyInfo(r.ToPort, r.Mark)
		return append(out, &expr.Target{Name: "TPROXY", Rev: tproxyRev, Info: &info}), nil
	case iptables.TargetCT:
		if r.Zone == 0 {
			return nil, errors.New("CT into zone 0")
		}
		return append(out, &expr.Target{Name: "CT", Rev: ctRev, Info: new(ctInfo(r.Zone))}), nil
	}
	if !iptables.IsOurChain(r.Target) {
		return nil, fmt.Errorf("target %q is not one of ours", r.Target)
	}
	return append(out, &expr.Verdict{Kind: expr.VerdictJump, Chain: r.Target}), nil
}

// ctStateMasks are the conntrack match's state masks for the state lists we write
// (XT_CONNTRACK_STATE_BIT: INVALID is bit 0, ESTABLISHED 1, RELATED 2).
var ctStateMasks = [...]ctStateMask{{iptables.CTStateInvalid, 1}, {iptables.CTStateEstablished, 6}}

type ctStateMask struct {
	states string
	mask   uint16
}

// conntrackInfo is xt_conntrack_mtinfo3 matching the state mask alone.
func conntrackInfo(f iptables.Family, mask uint16) *xt.ConntrackMtinfo3 {
	// The address fields are the family's zero address and mask, which is what the xt type
	// decodes back; they are not matched (only the state flag is set).
	zero, zmask := net.IPv4zero.To4(), net.CIDRMask(0, 32)
	if f == iptables.IPv6 {
		zero, zmask = net.IPv6zero, net.CIDRMask(0, 128)
	}
	var c xt.ConntrackMtinfo3
	b := &c.ConntrackMtinfoBase
	b.OrigSrcAddr, b.OrigDstAddr, b.ReplSrcAddr, b.ReplDstAddr = zero, zero, zero, zero
	b.OrigSrcMask, b.OrigDstMask, b.ReplSrcMask, b.ReplDstMask = zmask, zmask, zmask, zmask
	b.MatchFlags = xtCTState
	c.StateMask = mask
	return &c
}

// tproxyInfo is xt_tproxy_target_info_v1 (hand-laid: google/nftables' xt has no TPROXY type):
// the mark under a full mask, the unspecified address (keep the destination) and the port.
func tproxyInfo(p uint16, mark uint32) xt.Unknown {
	b := make(xt.Unknown, tproxyInfoLen)
	binary.NativeEndian.PutUint32(b[0:], 0xffffffff) // mark_mask
	binary.NativeEndian.PutUint32(b[4:], mark)       // mark_value
	binary.BigEndian.PutUint16(b[24:], p)            // lport, after the 16 bytes of laddr
	return b
}

// ctInfo is xt_ct_target_info_v1 (hand-laid: google/nftables' xt has no CT type) setting the
// zone alone; the trailing pointer is the kernel's.
func ctInfo(zone uint16) xt.Unknown {
	b := make(xt.Unknown, ctInfoLen)
	binary.NativeEndian.PutUint16(b[2:], zone)
	return b
}

func port(p uint16) []byte { return binary.BigEndian.AppendUint16(nil, p) }

// ifname is what iptables-nft compares an interface name with: the name and its terminating NUL,
// or, for a "name+" wildcard, the name alone (a prefix match).
func ifname(name string) []byte {
	if n := len(name); n > 0 && name[n-1] == '+' {
		return []byte(name[:n-1])
	}
	return append([]byte(name), 0)
}

// addrOffset is where the source (src) or destination address sits in family f's network
// header, and its length: what a payload expression loads to match an address, in the native
// table as in iptables-nft's.
func addrOffset(f iptables.Family, src bool) (offset, length uint32) {
	switch {
	case f == iptables.IPv6 && src:
		return 8, 16
	case f == iptables.IPv6:
		return 24, 16
	case src:
		return 12, 4
	default:
		return 16, 4
	}
}

// addrMatch loads the source or destination address and compares it with p. Like iptables-nft,
// it loads only the whole bytes of a byte-aligned prefix, and otherwise the whole address masked.
func addrMatch(out []expr.Any, pool *exprPool, f iptables.Family, p netip.Prefix, src bool) []expr.Any {
	off, n := addrOffset(f, src)
	addr := pool.addr(p.Masked().Addr())
	if p.Bits()%8 == 0 {
		n = uint32(p.Bits() / 8)
		return append(out, addrLoad(off, n), pool.cmp(addr[:n]))
	}
	mask := net.CIDRMask(p.Bits(), int(n)*8)
	return append(out, addrLoad(off, n),
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: n, Mask: mask, Xor: make([]byte, n)},
		pool.cmp(addr))
}

// ownerInfo is xt_owner_match_info matching one UID (what XT_OWNER_UID) or GID.
func ownerInfo(what byte, id uint32) xt.Unknown {
	b := make(xt.Unknown, ownerInfoLen)
	off := 0 // uid_min, uid_max
	if what == xtOwnerGID {
		off = 8 // gid_min, gid_max
	}
	binary.NativeEndian.PutUint32(b[off:], id)
	binary.NativeEndian.PutUint32(b[off+4:], id)
	b[16] = what
	return b
}

// multiportInfo is xt_multiport_v1 matching the destination ports: a range takes two slots, its
// first flagged in pflags.
func multiportInfo(ports []iptables.PortRange) (xt.Unknown, error) {
	b := make(xt.Unknown, multiportLen)
	b[0] = xtMultiportDst
	n := 0
	put := func(p uint16) error {
		if n == maxMultiport {
			return fmt.Errorf("more than %d multiport ports (a range counts two)", maxMultiport)
		}
		binary.NativeEndian.PutUint16(b[2+2*n:], p)
		n++
		return nil
	}
	for _, p := range ports {
		if p.First != p.Last {
			b[32+n] = 1
			if err := put(p.First); err != nil {
				return nil, err
			}
		}
		if err := put(p.Last); err != nil {
			return nil, err
		}
	}
	b[1] = byte(n)
	return b, nil
}

// redirectInfo is the REDIRECT target's range: only the port.
func redirectInfo(f iptables.Family, p uint16) xt.InfoAny {
	flags := uint(unix.NF_NAT_RANGE_PROTO_SPECIFIED)
	if f == iptables.IPv6 {
		return &xt.NatRange{Flags: flags, MinIP: net.IPv6zero, MaxIP: net.IPv6zero, MinPort: p, MaxPort: p}
	}
	zero := net.IPv4zero.To4()
	return &xt.NatIPv4MultiRangeCompat{{Flags: flags, MinIP: zero, MaxIP: zero, MinPort: p, MaxPort: p}}
}

// decodeXT maps the expressions of a rule in chain back onto an XTRule. ok is false when the
// rule is not exactly one that encodeXT writes, whatever it looks like: the expressions are read
// leniently (a load reads the comparison after it too, an address load its mask), and what they
// read as must encode back to exactly them.
func decodeXT(f iptables.Family, table, chain string, r rule) (x iptables.XTRule, ok bool) {
	x.Chain = chain
	if table != iptables.Table {
		x.Table = table
	}
	ex := r.exprs
	for i := 0; i < len(ex); i++ {
		switch e := ex[i].(type) {
		case *expr.Meta:
			i++
			d := cmpData(ex, i)
			switch e.Key {
			case expr.MetaKeyOIFNAME:
				x.OutInterface = ifnameOf(d)
			case expr.MetaKeyIIFNAME:
				x.InInterface = ifnameOf(d)
			default: // the l4proto load
				x.TCP = bytes.Equal(d, []byte{unix.IPPROTO_TCP})
				x.UDP = bytes.Equal(d, []byte{unix.IPPROTO_UDP})
			}
		case *expr.Payload:
			i++
			if e.Base == expr.PayloadBaseTransportHeader {
				pr := &x.DPort
				if e.Offset == 0 {
					pr = &x.SPort
				}
				pr.First = uint16At(cmpData(ex, i))
				pr.Last = pr.First
				if c, ok := next[*expr.Range](ex, i); ok {
					pr.First, pr.Last = uint16At(c.FromData), uint16At(c.ToData)
				}
				continue
			}
			var mask []byte
			if b, ok := next[*expr.Bitwise](ex, i); ok {
				mask, i = b.Mask, i+1
			}
			d := cmpData(ex, i)
			bits := len(d) * 8
			if mask != nil {
				ones, _ := net.IPMask(mask).Size()
				bits = max(ones, 0)
			}
			srcOff, full := addrOffset(f, true)
			addr := make([]byte, full)
			copy(addr, d)
			a, _ := netip.AddrFromSlice(addr)
			if p := netip.PrefixFrom(a, bits); e.Offset == srcOff {
				x.Source = p
			} else {
				x.Destination = p
			}
		case *expr.Match:
			decodeXTMatch(&x, e)
		case *expr.Counter:
		case *expr.Verdict:
			x.Target = e.Chain // a jump's
			switch e.Kind {
			case expr.VerdictReturn:
				x.Target = iptables.TargetReturn
			case expr.VerdictDrop:
				x.Target = iptables.TargetDrop
			}
		case *expr.Target:
			decodeXTTarget(f, &x, e)
		default:
			return x, false
		}
	}
	if r.foreign != "" || x.Target == "" {
		return x, false
	}
	want, _, err := encodeXT(f, x)
	return x, err == nil && sameExprs(xtFamily(f), want, r.exprs)
}

// cmpData is the data of the equality comparison at ex[i], if that is one.
func cmpData(ex []expr.Any, i int) []byte {
	if c, ok := next[*expr.Cmp](ex, i); ok && c.Op == expr.CmpOpEq {
		return c.Data
	}
	return nil
}

// ifnameOf is iptables' interface name for the compared bytes: without its NUL the name is a
// prefix, which iptables writes with a trailing "+".
func ifnameOf(d []byte) string {
	if n := bytes.IndexByte(d, 0); n >= 0 {
		return string(d[:n])
	}
	return string(d) + "+"
}

// decodeXTMatch reads an xtables match: the comment, conntrack state, owner or multiport.
func decodeXTMatch(r *iptables.XTRule, e *expr.Match) {
	switch info := e.Info.(type) {
	case *xt.Comment:
		r.Comment = string(*info)
	case *xt.ConntrackMtinfo3:
		for _, m := range ctStateMasks {
			if m.mask == info.StateMask {
				r.CTState = m.states
			}
		}
	case *xt.Unknown:
		switch b := []byte(*info); {
		case e.Name == "owner" && len(b) == ownerInfoLen && b[16] == xtOwnerGID:
			id := binary.NativeEndian.Uint32(b[8:])
			r.GIDOwner = &id
		case e.Name == "owner" && len(b) == ownerInfoLen:
			id := binary.NativeEndian.Uint32(b)
			r.UIDOwner = &id
		case e.Name == "multiport" && len(b) == multiportLen:
			r.MultiportDPorts = append(r.MultiportDPorts, multiportPorts(b)...)
		}
	}
}

// multiportPorts reads the ports of an xt_multiport_v1 back, the inverse of multiportInfo.
func multiportPorts(b []byte) []iptables.PortRange {
	var ports []iptables.PortRange
	n := int(min(b[1], maxMultiport))
	for j := 0; j < n; j++ {
		p := binary.NativeEndian.Uint16(b[2+2*j:])
		pr := iptables.PortRange{First: p, Last: p}
		if b[32+j] != 0 && j+1 < n {
			j++
			pr.Last = binary.NativeEndian.Uint16(b[2+2*j:])
		}
		ports = append(ports, pr)
	}
	return ports
}

// decodeXTTarget reads a TPROXY, CT or REDIRECT target.
func decodeXTTarget(f iptables.Family, r *iptables.XTRule, e *expr.Target) {
	r.Target = e.Name
	switch info := e.Info.(type) {
	case *xt.Unknown:
		switch b := []byte(*info); len(b) {
		case tproxyInfoLen:
			r.Mark, r.ToPort = binary.NativeEndian.Uint32(b[4:]), binary.BigEndian.Uint16(b[24:])
			r.OnIP = netip.IPv4Unspecified()
			if f == iptables.IPv6 {
				r.OnIP = netip.IPv6Unspecified()
			}
		case ctInfoLen:
			r.Zone = binary.NativeEndian.Uint16(b[2:])
		}
	case *xt.NatIPv4MultiRangeCompat:
		if len(*info) == 1 {
			r.ToPort = (*info)[0].MinPort
		}
	case *xt.NatRange:
		r.ToPort = info.MinPort
	}
}

func next[T expr.Any](ex []expr.Any, i int) (T, bool) {
	var zero T
	if i >= len(ex) {
		return zero, false
	}
	v, ok := ex[i].(T)
	return v, ok
}

// sameExprs reports whether two expression lists are the same on the wire, counter values aside.
func sameExprs(fam byte, a, b []expr.Any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, err1 := marshalExpr(fam, a[i])
		y, err2 := marshalExpr(fam, b[i])
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
			return false
		}
	}
	return true
}

func marshalExpr(fam byte, e expr.Any) ([]byte, error) {
	if _, ok := e.(*expr.Counter); ok {
		e = &expr.Counter{} // packets and bytes count traffic, not the rule
	}
	return expr.Marshal(fam, e)
}
