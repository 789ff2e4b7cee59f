package nftables

// The read side: the table list (one raw dump, which also carries our plan comment, something
// google/nftables does not parse) and, when needed, the full table read back through
// google/nftables and mapped onto the builder's model so it compares with what NFT() expects.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// tableInfo is one table as listed by the kernel.
type tableInfo struct {
	Family  byte
	Name    string
	Handle  uint64
	Use     uint32
	Comment string
}

// listTables dumps every table of every family: one round trip that tells whether our table
// exists, which plan it records, and whether iptables-nft's nat tables exist.
func listTables(c *netlink.Conn) ([]tableInfo, error) {
	msgs, err := c.Execute(netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETTABLE),
			Flags: netlink.Request | netlink.Dump,
		},
		Data: nfgen(unix.AF_UNSPEC, 0),
	})
	if err != nil {
		return nil, fmt.Errorf("list nftables tables: %w", err)
	}
	var out []tableInfo
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		t := tableInfo{Family: m.Data[0]}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return nil, fmt.Errorf("decode table: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			switch ad.Type() {
			case unix.NFTA_TABLE_NAME:
				t.Name = ad.String()
			case unix.NFTA_TABLE_USE:
				t.Use = ad.Uint32()
			case nftaTableHandle:
				t.Handle = ad.Uint64()
			case nftaTableUserdata:
				t.Comment, _ = userdata.GetString(ad.Bytes(), udataTableComment)
			}
		}
		if err := ad.Err(); err != nil {
			return nil, fmt.Errorf("decode table: %w", err)
		}
		out = append(out, t)
	}
	return out, nil
}

func findTable(ts []tableInfo, family byte, name string) *tableInfo {
	for i := range ts {
		if ts[i].Family == family && ts[i].Name == name {
			return &ts[i]
		}
	}
	return nil
}

// readTable reads our table back into the builder's model. comment is the table comment from
// listTables.
func readTable(gc *nftables.Conn, comment string) (*iptables.NFTTable, error) {
	tbl := &nftables.Table{Name: iptables.NFTTableName, Family: nftables.TableFamilyINet}
	out := &iptables.NFTTable{Comment: comment}

	sets, err := gc.GetSets(tbl)
	if err != nil {
		return nil, fmt.Errorf("list sets of %s: %w", iptables.NFTTableName, err)
	}
	for _, s := range sets {
		elems, err := gc.GetSetElements(s)
		if err != nil {
			return nil, fmt.Errorf("list elements of set %s: %w", s.Name, err)
		}
		out.Sets = append(out.Sets, decodeSet(s, elems))
	}

	chains, err := gc.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return nil, fmt.Errorf("list chains: %w", err)
	}
	for _, c := range chains {
		if c.Table == nil || c.Table.Name != iptables.NFTTableName {
			continue
		}
		ch := iptables.NFTChain{Name: c.Name}
		if c.Hooknum != nil {
			ch.Hook = iptables.HookByNumber(uint32(*c.Hooknum))
		}
		if c.Priority != nil {
			ch.Priority = int(*c.Priority)
		}
		if c.Type != nftables.ChainTypeNAT {
			ch.Type = string(c.Type)
			if ch.Type == "" {
				ch.Type = "none"
			}
		}
		if c.Policy != nil && *c.Policy != nftables.ChainPolicyAccept {
			ch.Policy = "drop"
		}
		rules, err := gc.GetRules(tbl, c)
		if err != nil {
			return nil, fmt.Errorf("list rules of chain %s: %w", c.Name, err)
		}
		for _, r := range rules {
			ch.Rules = append(ch.Rules, decodeRule(r))
		}
		out.Chains = append(out.Chains, ch)
	}
	return out, nil
}

// decodeSet turns interval set elements back into inclusive intervals.
func decodeSet(s *nftables.Set, elems []nftables.SetElement) iptables.NFTSet {
	out := iptables.NFTSet{Name: s.Name, Type: iptables.NFTSetType(s.KeyType.Name)}
	if !s.Constant || !s.Interval || s.IsMap || s.Anonymous {
		var f []string
		for _, x := range []struct {
			on   bool
			name string
		}{{s.Constant, "constant"}, {s.Interval, "interval"}, {s.IsMap, "map"}, {s.Anonymous, "anonymous"}, {s.HasTimeout, "timeout"}} {
			if x.on {
				f = append(f, x.name)
			}
		}
		out.Flags = strings.Join(f, ",")
		if out.Flags == "" {
			out.Flags = "none"
		}
	}
	if !s.Interval {
		// A plain set: every element is a single key.
		for _, e := range elems {
			out.Elements = append(out.Elements, iptables.NFTInterval{First: e.Key, Last: e.Key})
		}
		out.Elements = iptables.NormalizeIntervals(out.Elements)
		return out
	}
	// Sort by key; at equal keys an interval end (of the previous interval) comes before a
	// start. Then each start pairs with the end that follows it (the key after its last one);
	// a start with no end runs to the top of the key space; stray ends (nft's leading zero
	// marker) carry no interval.
	sorted := slices.Clone(elems)
	sort.SliceStable(sorted, func(i, j int) bool {
		if c := bytes.Compare(sorted[i].Key, sorted[j].Key); c != 0 {
			return c < 0
		}
		return sorted[i].IntervalEnd && !sorted[j].IntervalEnd
	})
	for i := 0; i < len(sorted); i++ {
		e := sorted[i]
		if e.IntervalEnd {
			continue
		}
		last := bytes.Repeat([]byte{0xff}, len(e.Key))
		if i+1 < len(sorted) && sorted[i+1].IntervalEnd {
			last = decrement(sorted[i+1].Key)
			i++
		}
		out.Elements = append(out.Elements, iptables.NFTInterval{First: e.Key, Last: last})
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

// decodeRule maps a rule's expressions back onto the model: the inverse of ruleExprs, which is
// also what nft writes for the script. Anything else becomes an NFTMatchUnknown, so it shows
// in a diff instead of being silently taken as a match.
func decodeRule(r *nftables.Rule) iptables.NFTRule {
	var out iptables.NFTRule
	if c, ok := userdata.GetString(r.UserData, userdata.TypeComment); ok {
		out.Comment = c
	}
	ex := r.Exprs
	unknown := func(e expr.Any) {
		out.Matches = append(out.Matches, iptables.NFTMatch{Kind: iptables.NFTMatchUnknown, Name: fmt.Sprintf("%T%+v", e, e)})
	}
	verdict := false
	for i := 0; i < len(ex); i++ {
		// meta load + cmp eq: the start of every match.
		if m, ok := ex[i].(*expr.Meta); ok && !m.SourceRegister && i+1 < len(ex) {
			c, ok := ex[i+1].(*expr.Cmp)
			if !ok || c.Op != expr.CmpOpEq || c.Register != m.Register {
				unknown(ex[i])
				continue
			}
			i++
			switch {
			case m.Key == expr.MetaKeyNFPROTO && len(c.Data) == 1:
				fam := familyOf(c.Data[0])
				if fam == "" {
					unknown(c)
					continue
				}
				// Followed by an address lookup, it is the dependency nft adds for it.
				if i+2 < len(ex) {
					if p, ok := ex[i+1].(*expr.Payload); ok && p.Base == expr.PayloadBaseNetworkHeader {
						if l, ok := ex[i+2].(*expr.Lookup); ok && !l.Invert && l.SourceRegister == p.DestRegister {
							kind := iptables.NFTMatchKind(0)
							for _, src := range []bool{true, false} {
								if off, ln := iptables.AddrOffset(fam, src); p.Offset == off && p.Len == ln {
									kind = iptables.NFTMatchDAddrSet
									if src {
										kind = iptables.NFTMatchSAddrSet
									}
								}
							}
							if kind != 0 {
								out.Matches = append(out.Matches, iptables.NFTMatch{Kind: kind, Family: fam, Set: l.SetName})
								i += 2
								continue
							}
						}
					}
				}
				out.Matches = append(out.Matches, iptables.NFTMatch{Kind: iptables.NFTMatchNFProto, Family: fam})
			case m.Key == expr.MetaKeyL4PROTO && len(c.Data) == 1 && c.Data[0] == unix.IPPROTO_TCP:
				if i+2 < len(ex) {
					if p, ok := ex[i+1].(*expr.Payload); ok && p.Base == expr.PayloadBaseTransportHeader && p.Offset == 2 && p.Len == 2 {
						if l, ok := ex[i+2].(*expr.Lookup); ok && !l.Invert && l.SourceRegister == p.DestRegister {
							out.Matches = append(out.Matches, iptables.NFTMatch{Kind: iptables.NFTMatchDPortSet, Set: l.SetName})
							i += 2
							continue
						}
					}
				}
				out.Matches = append(out.Matches, iptables.NFTMatch{Kind: iptables.NFTMatchTCP})
			case m.Key == expr.MetaKeySKUID && len(c.Data) == 4:
				out.Matches = append(out.Matches, iptables.NFTMatch{Kind: iptables.NFTMatchSkUID, ID: binaryutil.NativeEndian.Uint32(c.Data)})
			case m.Key == expr.MetaKeySKGID && len(c.Data) == 4:
				out.Matches = append(out.Matches, iptables.NFTMatch{Kind: iptables.NFTMatchSkGID, ID: binaryutil.NativeEndian.Uint32(c.Data)})
			case m.Key == expr.MetaKeyOIFNAME && len(c.Data) == unix.IFNAMSIZ:
				out.Matches = append(out.Matches, iptables.NFTMatch{Kind: iptables.NFTMatchOIFName, Name: string(bytes.TrimRight(c.Data, "\x00"))})
			default:
				unknown(m)
				unknown(c)
			}
			continue
		}
		// The verdicts: return, or immediate port + redirect to it.
		if v, ok := ex[i].(*expr.Verdict); ok && v.Kind == expr.VerdictReturn && i == len(ex)-1 {
			verdict = true
			continue
		}
		if im, ok := ex[i].(*expr.Immediate); ok && len(im.Data) == 2 && i+2 == len(ex) {
			if rd, ok := ex[i+1].(*expr.Redir); ok && rd.RegisterProtoMin == im.Register &&
				(rd.RegisterProtoMax == 0 || rd.RegisterProtoMax == im.Register) && rd.Flags == unix.NF_NAT_RANGE_PROTO_SPECIFIED {
				out.Verdict, out.RedirectPort = iptables.NFTRedirect, binary.BigEndian.Uint16(im.Data)
				verdict = true
				break
			}
		}
		unknown(ex[i])
	}
	if !verdict {
		out.Matches = append(out.Matches, iptables.NFTMatch{Kind: iptables.NFTMatchUnknown, Name: "no return or redirect verdict"})
	}
	return out
}

func familyOf(b byte) iptables.Family {
	switch b {
	case unix.NFPROTO_IPV4:
		return iptables.IPv4
	case unix.NFPROTO_IPV6:
		return iptables.IPv6
	}
	return ""
}
