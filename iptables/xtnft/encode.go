package xtnft

// The encoding: one iptables.XTRule as the nf_tables expressions iptables-nft 1.8.9 builds for
// the same iptables-restore line, found by writing our payloads with iptables-nft-restore and
// dumping them. Interface, protocol and address matches are native expressions; the tcp
// destination port too. The owner, multiport and comment matches and the REDIRECT target are
// xtables extensions run by the kernel's nft_compat, each with its revision and the extension's
// own C struct as info. Every rule carries a counter before its verdict, as iptables-nft's do.
//
// decode is the inverse, and is strict by construction: a rule read back counts as one of ours
// only if encoding what it decodes to gives back exactly the expressions read.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// natPriority is the priority of the base chains of iptables-nft's nat table that we use:
// PREROUTING and OUTPUT are both NF_IP_PRI_NAT_DST. A chain at another priority makes
// iptables-nft call the table incompatible.
const natPriority = -100

// Extension revisions and info sizes, as iptables-nft 1.8.9 sends them. The info is the
// extension's C struct, padded to 8 bytes (XT_ALIGN), in host byte order except where the struct
// itself says network order.
const (
	ownerRev       = 1              // xt_owner_match_info
	ownerInfoLen   = 24             // 4 u32 + 2 u8, padded
	multiportRev   = 1              // xt_multiport_v1
	multiportLen   = 48             // flags, count, ports[15], pflags[15], invert
	redirectRev    = 0              // nf_nat_ipv4_multi_range_compat (ip), nf_nat_range (ip6)
	redirectLen4   = 24             // rangesize, then one range: flags, min_ip, max_ip, min and max port
	redirectLen6   = 40             // flags, min_addr, max_addr, min and max port
	commentRev     = 0              // xt_comment_info
	xtOwnerUID     = 1              // XT_OWNER_UID
	xtOwnerGID     = 2              // XT_OWNER_GID
	xtMultiportDst = 1              // XT_MULTIPORT_DESTINATION
	maxMultiport   = 15             // XT_MULTI_PORTS
	nfAccept       = 1              // NF_ACCEPT, the built-in chains' policy
	reg1           = unix.NFT_REG_1 // the only data register iptables-nft uses
	commentLen     = 256            // XT_MAX_COMMENT_LEN
)

// family is the nf_tables family of an iptables family: iptables-nft's "ip" and "ip6".
func family(f iptables.Family) byte {
	if f == iptables.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// encoded is one rule ready for a NEWRULE message.
type encoded struct {
	exprs []expr.Any
	// proto is NFTA_RULE_COMPAT_PROTO: the layer-4 protocol the xtables extensions of the rule
	// may assume (multiport refuses a rule that does not say tcp).
	proto uint32
}

// sink receives the expressions of a rule, in order: encode writes each rule once, and the
// sink decides whether it becomes google/nftables expressions (to compare with what is read
// back) or bytes in a batch (to write, without building the expressions first).
type sink interface {
	// meta loads a packet property into register 1.
	meta(key expr.MetaKey)
	// cmp compares register 1 with data. data is only valid during the call.
	cmp(data []byte)
	// payload loads n bytes at offset off of a packet header into register 1.
	payload(base expr.PayloadBase, off, n uint32)
	// mask ands register 1 with mask.
	mask(mask []byte)
	// between checks that register 1 lies between from and to.
	between(from, to []byte)
	// xt runs an xtables match (or target) with its revision and info struct.
	xt(target bool, name string, rev uint32, info []byte)
	// comment is the comment match: xt_comment_info, the text padded to its fixed size.
	comment(text string)
	counter()
	verdict(kind expr.VerdictKind, chain string)
}

// encode returns the expressions of r for family f.
func encode(f iptables.Family, r iptables.XTRule) (encoded, error) {
	s := &exprSink{out: make([]expr.Any, 0, 8)}
	proto, err := encodeTo(f, r, s)
	return encoded{exprs: s.out, proto: proto}, err
}

// encodeTo hands the expressions of r for family f to s, and returns the layer-4 protocol
// the rule's xtables extensions may assume (NFTA_RULE_COMPAT_PROTO: multiport refuses a rule
// that does not say tcp).
func encodeTo(f iptables.Family, r iptables.XTRule, s sink) (uint32, error) {
	if r.OutInterface != "" {
		s.meta(expr.MetaKeyOIFNAME)
		s.cmp(ifname(r.OutInterface))
	}
	var proto uint32
	if r.TCP {
		proto = unix.IPPROTO_TCP
		s.meta(expr.MetaKeyL4PROTO)
		s.cmp([]byte{unix.IPPROTO_TCP})
	}
	for _, a := range [2]struct {
		p   netip.Prefix
		src bool
	}{{r.Source, true}, {r.Destination, false}} {
		if !a.p.IsValid() || a.p.Bits() == 0 {
			continue // what iptables does with 0.0.0.0/0: no match at all
		}
		if a.p.Addr().Is4() != (f == iptables.IPv4) {
			return 0, fmt.Errorf("address %s in an %s rule", a.p, f)
		}
		addrMatch(s, f, a.p, a.src)
	}
	if r.UIDOwner != nil {
		s.xt(false, "owner", ownerRev, ownerInfo(xtOwnerUID, *r.UIDOwner))
	}
	if r.GIDOwner != nil {
		s.xt(false, "owner", ownerRev, ownerInfo(xtOwnerGID, *r.GIDOwner))
	}
	if len(r.MultiportDPorts) > 0 {
		info, err := multiportInfo(r.MultiportDPorts)
		if err != nil {
			return 0, err
		}
		s.xt(false, "multiport", multiportRev, info)
	}
	if r.DPort.First != 0 {
		if !r.TCP {
			return 0, errors.New("a destination port without -p tcp")
		}
		// tcp dport: the transport header's bytes 2 and 3.
		s.payload(expr.PayloadBaseTransportHeader, 2, 2)
		var first, last [2]byte
		binary.BigEndian.PutUint16(first[:], r.DPort.First)
		binary.BigEndian.PutUint16(last[:], r.DPort.Last)
		if r.DPort.First == r.DPort.Last {
			s.cmp(first[:])
		} else {
			s.between(first[:], last[:])
		}
	}
	if len(r.Comment) >= commentLen {
		return 0, fmt.Errorf("comment %q is longer than iptables allows (%d bytes)", r.Comment, commentLen-1)
	}
	s.comment(r.Comment)
	s.counter()
	switch r.Target {
	case iptables.TargetReturn:
		s.verdict(expr.VerdictReturn, "")
	case iptables.TargetRedirect:
		if r.ToPort == 0 {
			return 0, errors.New("redirect to port 0")
		}
		s.xt(true, "REDIRECT", redirectRev, redirectInfo(f, r.ToPort))
	case iptables.RedirectChain, iptables.OutputChain:
		s.verdict(expr.VerdictJump, r.Target)
	default:
		return 0, fmt.Errorf("target %q is not one of ours", r.Target)
	}
	return proto, nil
}

// exprSink collects google/nftables expressions.
type exprSink struct{ out []expr.Any }

func (s *exprSink) meta(key expr.MetaKey) {
	s.out = append(s.out, &expr.Meta{Key: key, Register: reg1})
}

func (s *exprSink) cmp(data []byte) {
	s.out = append(s.out, &expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: bytes.Clone(data)})
}

func (s *exprSink) payload(base expr.PayloadBase, off, n uint32) {
	s.out = append(s.out, &expr.Payload{DestRegister: reg1, Base: base, Offset: off, Len: n})
}

func (s *exprSink) mask(mask []byte) {
	s.out = append(s.out, &expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: uint32(len(mask)),
		Mask: bytes.Clone(mask), Xor: make([]byte, len(mask))})
}

func (s *exprSink) between(from, to []byte) {
	s.out = append(s.out, &expr.Range{Op: expr.CmpOpEq, Register: reg1, FromData: bytes.Clone(from), ToData: bytes.Clone(to)})
}

func (s *exprSink) xt(target bool, name string, rev uint32, info []byte) {
	i := xt.Unknown(info)
	if target {
		s.out = append(s.out, &expr.Target{Name: name, Rev: rev, Info: &i})
		return
	}
	s.out = append(s.out, &expr.Match{Name: name, Rev: rev, Info: &i})
}

func (s *exprSink) comment(text string) {
	info := make([]byte, commentLen)
	copy(info, text)
	s.xt(false, "comment", commentRev, info)
}

func (s *exprSink) counter() { s.out = append(s.out, &expr.Counter{}) }

func (s *exprSink) verdict(kind expr.VerdictKind, chain string) {
	s.out = append(s.out, &expr.Verdict{Kind: kind, Chain: chain})
}

// ifname is what iptables-nft compares an interface name with: the name and its terminating NUL,
// or, for a "name+" wildcard, the name alone (a prefix match).
func ifname(name string) []byte {
	if n := len(name); n > 0 && name[n-1] == '+' {
		return []byte(name[:n-1])
	}
	return append([]byte(name), 0)
}

// addrMatch loads the source or destination address and compares it with p. Like iptables-nft,
// it loads only the whole bytes of a byte-aligned prefix, and otherwise the whole address masked.
func addrMatch(s sink, f iptables.Family, p netip.Prefix, src bool) {
	off, n := iptables.AddrOffset(f, src)
	a16 := p.Masked().Addr().As16()
	addr := a16[:]
	if f == iptables.IPv4 {
		addr = addr[12:]
	}
	if p.Bits()%8 == 0 {
		n = uint32(p.Bits() / 8)
		s.payload(expr.PayloadBaseNetworkHeader, off, n)
		s.cmp(addr[:n])
		return
	}
	var m [16]byte
	for i := range p.Bits() {
		m[i/8] |= 0x80 >> (i % 8)
	}
	s.payload(expr.PayloadBaseNetworkHeader, off, n)
	s.mask(m[:n])
	s.cmp(addr)
}

// ownerInfo is xt_owner_match_info matching one UID (what XT_OWNER_UID) or GID.
func ownerInfo(what byte, id uint32) []byte {
	b := make([]byte, ownerInfoLen)
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
func multiportInfo(ports []iptables.PortRange) ([]byte, error) {
	b := make([]byte, multiportLen)
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

// redirectInfo is the REDIRECT target's range: only the port, in network order.
func redirectInfo(f iptables.Family, port uint16) []byte {
	if f == iptables.IPv6 {
		b := make([]byte, redirectLen6)
		binary.NativeEndian.PutUint32(b, unix.NF_NAT_RANGE_PROTO_SPECIFIED)
		binary.BigEndian.PutUint16(b[36:], port)
		binary.BigEndian.PutUint16(b[38:], port)
		return b
	}
	b := make([]byte, redirectLen4)
	binary.NativeEndian.PutUint32(b, 1) // rangesize
	binary.NativeEndian.PutUint32(b[4:], unix.NF_NAT_RANGE_PROTO_SPECIFIED)
	binary.BigEndian.PutUint16(b[16:], port)
	binary.BigEndian.PutUint16(b[18:], port)
	return b
}

// decode maps the expressions of a rule in chain back onto an XTRule. ok is false when the rule
// is not exactly one that encode writes, whatever it looks like.
func decode(f iptables.Family, chain string, exprs []expr.Any) (r iptables.XTRule, ok bool) {
	r.Chain = chain
	if !decodeInto(f, &r, exprs) {
		return r, false
	}
	want, err := encode(f, r)
	return r, err == nil && sameExprs(f, want.exprs, exprs)
}

// decodeInto reads the expressions the way encode writes them; sameExprs then checks the rest.
func decodeInto(f iptables.Family, r *iptables.XTRule, ex []expr.Any) bool {
	data := func(i int) ([]byte, bool) {
		c, ok := next[*expr.Cmp](ex, i)
		if !ok || c.Op != expr.CmpOpEq {
			return nil, false
		}
		return c.Data, true
	}
	for i := 0; i < len(ex); i++ {
		switch e := ex[i].(type) {
		case *expr.Meta:
			d, ok := data(i + 1)
			if !ok {
				return false
			}
			i++
			switch {
			case e.Key == expr.MetaKeyOIFNAME:
				if n := bytes.IndexByte(d, 0); n >= 0 {
					r.OutInterface = string(d[:n])
				} else {
					r.OutInterface = string(d) + "+"
				}
			case e.Key == expr.MetaKeyL4PROTO && bytes.Equal(d, []byte{unix.IPPROTO_TCP}):
				r.TCP = true
			default:
				return false
			}
		case *expr.Payload:
			if e.Base == expr.PayloadBaseTransportHeader {
				if i+1 >= len(ex) {
					return false
				}
				i++
				switch c := ex[i].(type) {
				case *expr.Cmp:
					if len(c.Data) != 2 {
						return false
					}
					p := binary.BigEndian.Uint16(c.Data)
					r.DPort = iptables.PortRange{First: p, Last: p}
				case *expr.Range:
					if len(c.FromData) != 2 || len(c.ToData) != 2 {
						return false
					}
					r.DPort = iptables.PortRange{First: binary.BigEndian.Uint16(c.FromData), Last: binary.BigEndian.Uint16(c.ToData)}
				default:
					return false
				}
				continue
			}
			var mask []byte
			if b, ok := next[*expr.Bitwise](ex, i+1); ok {
				mask = b.Mask
				i++
			}
			d, ok := data(i + 1)
			if !ok {
				return false
			}
			i++
			p, src, ok := prefixOf(f, e, mask, d)
			if !ok {
				return false
			}
			if src {
				r.Source = p
			} else {
				r.Destination = p
			}
		case *expr.Match:
			info, _ := matchInfo(f, e.Name, e.Rev, e.Info)
			switch {
			case e.Name == "owner" && len(info) == ownerInfoLen:
				id := binary.NativeEndian.Uint32(info)
				if info[16] == xtOwnerGID {
					id = binary.NativeEndian.Uint32(info[8:])
					r.GIDOwner = &id
				} else {
					r.UIDOwner = &id
				}
			case e.Name == "multiport" && len(info) == multiportLen:
				n := int(min(info[1], maxMultiport))
				for j := 0; j < n; j++ {
					p := binary.NativeEndian.Uint16(info[2+2*j:])
					pr := iptables.PortRange{First: p, Last: p}
					if info[32+j] != 0 && j+1 < n {
						j++
						pr.Last = binary.NativeEndian.Uint16(info[2+2*j:])
					}
					r.MultiportDPorts = append(r.MultiportDPorts, pr)
				}
			case e.Name == "comment" && len(info) == commentLen:
				r.Comment = string(bytes.TrimRight(info, "\x00"))
			default:
				return false
			}
		case *expr.Counter:
		case *expr.Verdict:
			switch e.Kind {
			case expr.VerdictReturn:
				r.Target = iptables.TargetReturn
			case expr.VerdictJump:
				r.Target = e.Chain
			default:
				return false
			}
		case *expr.Target:
			info, _ := matchInfo(f, e.Name, e.Rev, e.Info)
			switch {
			case e.Name == "REDIRECT" && f == iptables.IPv4 && len(info) == redirectLen4:
				r.Target, r.ToPort = iptables.TargetRedirect, binary.BigEndian.Uint16(info[16:])
			case e.Name == "REDIRECT" && f == iptables.IPv6 && len(info) == redirectLen6:
				r.Target, r.ToPort = iptables.TargetRedirect, binary.BigEndian.Uint16(info[36:])
			default:
				return false
			}
		default:
			return false
		}
	}
	return r.Target != ""
}

func next[T expr.Any](ex []expr.Any, i int) (T, bool) {
	var zero T
	if i >= len(ex) {
		return zero, false
	}
	v, ok := ex[i].(T)
	return v, ok
}

// prefixOf turns an address load, its optional mask and the compared bytes back into a prefix.
func prefixOf(f iptables.Family, p *expr.Payload, mask, data []byte) (netip.Prefix, bool, bool) {
	if p.Base != expr.PayloadBaseNetworkHeader {
		return netip.Prefix{}, false, false
	}
	srcOff, full := iptables.AddrOffset(f, true)
	dstOff, _ := iptables.AddrOffset(f, false)
	var src bool
	switch p.Offset {
	case srcOff:
		src = true
	case dstOff:
	default:
		return netip.Prefix{}, false, false
	}
	if p.Len > full || int(p.Len) != len(data) {
		return netip.Prefix{}, false, false
	}
	addr := make([]byte, full)
	copy(addr, data)
	a, _ := netip.AddrFromSlice(addr)
	bits := int(p.Len) * 8
	if mask != nil {
		bits = 0
		for _, m := range mask {
			for m&0x80 != 0 {
				bits++
				m <<= 1
			}
		}
	}
	// Not the canonical form of this prefix (a mask with holes, host bits set, a load of a whole
	// address under a byte-aligned mask): sameExprs refuses the re-encoding.
	return netip.PrefixFrom(a, bits), src, true
}

// matchInfo returns the raw info of a match or target as the kernel holds it.
func matchInfo(f iptables.Family, name string, rev uint32, info xt.InfoAny) ([]byte, error) {
	if info == nil {
		return nil, errors.New("no info")
	}
	return xt.Marshal(xt.TableFamily(family(f)), rev, info)
}

// sameExprs reports whether two expression lists are the same on the wire, counter values aside.
func sameExprs(f iptables.Family, a, b []expr.Any) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, err1 := marshalExpr(f, a[i])
		y, err2 := marshalExpr(f, b[i])
		if err1 != nil || err2 != nil || !bytes.Equal(x, y) {
			return false
		}
	}
	return true
}

func marshalExpr(f iptables.Family, e expr.Any) ([]byte, error) {
	if _, ok := e.(*expr.Counter); ok {
		e = &expr.Counter{} // packets and bytes count traffic, not the rule
	}
	return expr.Marshal(family(f), e)
}
