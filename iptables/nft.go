package iptables

// The nftables rendering of a Ruleset: one "inet" table for both families, with lists in
// interval sets so that a rule's cost does not grow with its list. NFT renders the plan as a
// model that iptables/nfnl translates into expressions, and Statements as nft commands (show,
// --simulate); TestRenderingsAgree holds it equal to the iptables rendering.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Names of the nftables objects. The chains keep the iptables chain names, so runbooks that
// look for PROXY_INIT_REDIRECT and PROXY_INIT_OUTPUT find them in `nft list ruleset` too.
const (
	NFTFamily    = "inet"
	NFTTableName = "proxy_init"
	// NFTPriority is where iptables' nat PREROUTING and OUTPUT chains sit (NF_IP_PRI_NAT_DST,
	// nft's "dstnat"), so the two backends see packets at the same point.
	NFTPriority = -100
	// NFTCommentMax is the longest comment nft accepts (and prints back unchanged).
	NFTCommentMax = 128
	// nftFormat versions the table layout: in the recorded plan, so a new layout rewrites it.
	nftFormat = 1
)

// FamilyInet is the Family the nftables backend reports in State: one table serves both.
const FamilyInet Family = "inet"

// NFTSetType is an nftables set key type.
type NFTSetType string

const (
	NFTPorts NFTSetType = "inet_service"
	NFTIPv4  NFTSetType = "ipv4_addr"
	NFTIPv6  NFTSetType = "ipv6_addr"
)

// NFTInterval is an inclusive range of set keys in network byte order.
type NFTInterval struct {
	First, Last []byte
}

// After returns the key after the interval (how interval sets store its end), false at the top.
func (iv NFTInterval) After() ([]byte, bool) {
	out := slices.Clone(iv.Last)
	for i := len(out) - 1; i >= 0; i-- {
		out[i]++
		if out[i] != 0 {
			return out, true
		}
	}
	return nil, false
}

// NFTSet is a named, constant interval set. Elements are sorted, disjoint and never adjacent, as
// the kernel holds them, so a set read back compares equal to the one written.
type NFTSet struct {
	Name string
	Type NFTSetType
	// Flags is empty for those NFT always writes ("constant,interval"); others read back show.
	Flags    string
	Elements []NFTInterval
}

// NFTMatchKind is one nft match statement. Each kind includes the protocol dependency nft itself
// adds (a port match implies "meta l4proto tcp", an address match "meta nfproto"), so the
// expressions the applier writes are exactly those `nft -f` writes for the script.
type NFTMatchKind int

const (
	NFTMatchNFProto  NFTMatchKind = iota + 1 // "meta nfproto ipv4|ipv6" (Family)
	NFTMatchTCP                              // "meta l4proto tcp"
	NFTMatchDPortSet                         // "tcp dport @Set"
	NFTMatchSAddrSet                         // "ip saddr @Set" or "ip6 saddr @Set" (Family)
	NFTMatchDAddrSet                         // "ip daddr @Set" or "ip6 daddr @Set" (Family)
	NFTMatchSkUID                            // "meta skuid ID"
	NFTMatchSkGID                            // "meta skgid ID"
	NFTMatchOIFName                          // `oifname "Name"`, matched by name like iptables' -o
	// NFTMatchUnknown stands for expressions read back from the kernel that map to none of the
	// others; Name describes them. NFT never produces it.
	NFTMatchUnknown
	NFTMatchIIFName  // `iifname "Name"`, like iptables' -i
	NFTMatchTCPDPort // "tcp dport ID"
	NFTMatchUDPDPort // "udp dport ID"
	NFTMatchUDPSPort // "udp sport ID"
	NFTMatchCTState  // "ct state Name": the conntrack states of the bit mask ID
)

// Conntrack state bits, as nft's ct state matches them (NF_CT_STATE_BIT and its neighbours).
const (
	NFTCTInvalid     = 1
	NFTCTEstablished = 2
	NFTCTRelated     = 4
)

// NFTMatch is one match of a rule; which fields are used depends on Kind.
type NFTMatch struct {
	Kind   NFTMatchKind
	Family Family // NFProto, SAddrSet, DAddrSet
	Set    string // DPortSet, SAddrSet, DAddrSet
	ID     uint32 // SkUID, SkGID
	Name   string // OIFName
}

// String renders the match in nft syntax.
func (m NFTMatch) String() string {
	ip := cmp.Or(map[Family]string{IPv6: "ip6"}[m.Family], "ip")
	switch m.Kind {
	case NFTMatchNFProto:
		return "meta nfproto " + string(m.Family)
	case NFTMatchTCP:
		return "meta l4proto tcp"
	case NFTMatchDPortSet:
		return "tcp dport @" + m.Set
	case NFTMatchSAddrSet:
		return ip + " saddr @" + m.Set
	case NFTMatchDAddrSet:
		return ip + " daddr @" + m.Set
	case NFTMatchSkUID, NFTMatchSkGID, NFTMatchTCPDPort, NFTMatchUDPDPort, NFTMatchUDPSPort:
		return nftMatchPrefixes[m.Kind] + strconv.FormatUint(uint64(m.ID), 10)
	case NFTMatchOIFName, NFTMatchIIFName:
		return nftMatchPrefixes[m.Kind] + strconv.Quote(m.Name)
	case NFTMatchCTState:
		return "ct state " + ctStateNames(m.ID)
	case NFTMatchUnknown:
		return "<unrecognized: " + m.Name + ">"
	}
	return fmt.Sprintf("<unknown match %d>", m.Kind)
}

// nftMatchPrefixes are the words before a match's value, by kind: an array, not a map, which the
// CNI plugin, linking this package, would build at every start.
var nftMatchPrefixes = [...]string{NFTMatchSkUID: "meta skuid ", NFTMatchSkGID: "meta skgid ",
	NFTMatchTCPDPort: "tcp dport ", NFTMatchUDPDPort: "udp dport ", NFTMatchUDPSPort: "udp sport ",
	NFTMatchOIFName: "oifname ", NFTMatchIIFName: "iifname "}

// ctStateNames spells a state mask as nft lists it: "invalid", "established,related".
func ctStateNames(mask uint32) string {
	var names []string
	for i, name := range []string{"invalid", "established", "related"} { // NFTCTInvalid << i
		if bit := uint32(NFTCTInvalid) << i; mask&bit != 0 {
			names, mask = append(names, name), mask&^bit
		}
	}
	if mask != 0 || len(names) == 0 {
		names = append(names, fmt.Sprintf("%#x", mask))
	}
	return strings.Join(names, ",")
}

// NFTVerdict is what a rule does with a packet that matches.
type NFTVerdict int

const (
	NFTReturn   NFTVerdict = iota // leaves the chain: the packet skips the proxy
	NFTRedirect                   // redirects the packet to RedirectPort on the local host
	NFTDrop                       // drops the packet
	NFTZone                       // puts the packet's connection into conntrack zone Zone, and goes on
	// NFTTPROXY hands the packet to the transparent socket on RedirectPort, marked Mark, or,
	// where none takes it, ends the rule without a verdict.
	NFTTPROXY
)

// NFTRule is one rule: every match must hold, then the verdict applies.
type NFTRule struct {
	Comment      string
	Matches      []NFTMatch
	Verdict      NFTVerdict
	RedirectPort uint16 // NFTRedirect and NFTTPROXY only
	Zone         uint16 // NFTZone only
	Mark         uint32 // NFTTPROXY only
	// TPROXYFamily limits a TPROXY rule to one family (nft's "tproxy ip"); empty for both.
	TPROXYFamily Family
}

// String renders the rule in nft syntax, as `nft list` prints it.
func (r NFTRule) String() string {
	var parts []string
	for _, m := range r.Matches {
		parts = append(parts, m.String())
	}
	switch r.Verdict {
	case NFTReturn:
		parts = append(parts, "return")
	case NFTRedirect:
		parts = append(parts, "redirect to :"+strconv.Itoa(int(r.RedirectPort)))
	case NFTDrop:
		parts = append(parts, "drop")
	case NFTZone:
		parts = append(parts, "ct zone set "+strconv.Itoa(int(r.Zone)))
	case NFTTPROXY:
		fam := map[Family]string{IPv4: "ip ", IPv6: "ip6 "}[r.TPROXYFamily]
		parts = append(parts, fmt.Sprintf("tproxy %sto :%d meta mark set 0x%08x accept", fam, r.RedirectPort, r.Mark))
	default:
		parts = append(parts, fmt.Sprintf("<unknown verdict %d>", r.Verdict))
	}
	if r.Comment != "" {
		parts = append(parts, "comment "+strconv.Quote(r.Comment))
	}
	return strings.Join(parts, " ")
}

// NFTChain is a base chain.
type NFTChain struct {
	Name     string
	Hook     Hook
	Priority int
	// Type is empty for nat, and Policy for accept; others read back show.
	Type, Policy string
	Rules        []NFTRule
}

// Header renders the chain's type line.
func (c NFTChain) Header() string {
	return fmt.Sprintf("type %s hook %s priority %d; policy %s;", cmp.Or(c.Type, "nat"), c.Hook.NFT, c.Priority,
		cmp.Or(c.Policy, "accept"))
}

// NFTTable is the whole table: what the native backend writes in one batch.
type NFTTable struct {
	// Comment records the plan (NFTComment), so an identical re-run can skip the write.
	Comment string
	Sets    []NFTSet
	Chains  []NFTChain
}

// NFTComment is the table comment that records the plan: its hash and the table layout version.
func (r *Ruleset) NFTComment() string {
	return fmt.Sprintf("proxy-init/plan %s format %d", r.Hash(), nftFormat)
}

// NFT renders the plan as one nftables table, each chain where its iptables table is. Each step
// is one rule, but an address list (a rule per family) and TPROXY (a second rule drops what no
// socket took, as iptables' TPROXY does). Lists live in sets named after their direction (per
// family for addresses, only when non-empty), shared by the rules that use one. Without IPv6,
// every rule that acts matches "meta nfproto ipv4", so IPv6 passes as with no ip6tables rules.
func (r *Ruleset) NFT() NFTTable {
	w := &nftWriter{r: r, t: NFTTable{Comment: r.NFTComment()}}
	if !r.HasFamily(IPv6) {
		w.only4 = []NFTMatch{{Kind: NFTMatchNFProto, Family: IPv4}}
	}
	for _, c := range r.Plan() {
		w.ch = NFTChain{Name: c.Name, Hook: c.Hook, Priority: c.Table.Priority}
		if c.Table.ChainType != "nat" {
			w.ch.Type = c.Table.ChainType
		}
		for _, s := range c.Steps {
			sc := s.Common()
			w.iif, w.dir = sc.Arriving, cmp.Or(sc.Direction, c.Direction)
			s.nftRules(w)
		}
		w.t.Chains = append(w.t.Chains, w.ch)
	}
	return w.t
}

// nftWriter builds the table NFT returns, a chain at a time.
type nftWriter struct {
	r     *Ruleset
	t     NFTTable
	only4 []NFTMatch // "meta nfproto ipv4" when IPv6 is off
	ch    NFTChain   // the chain being written
	iif   string     // the step's arriving interface, when it is limited to one
	dir   string     // the step's direction, which names the sets of its lists
}

// add adds rl to the chain, limited to the step's arriving interface.
func (w *nftWriter) add(rl NFTRule) {
	if w.iif != "" {
		rl.Matches = append([]NFTMatch{{Kind: NFTMatchIIFName, Name: w.iif}}, rl.Matches...)
	}
	w.ch.Rules = append(w.ch.Rules, rl)
}

// addSet adds the set name, unless the table has it already, and returns its name.
func (w *nftWriter) addSet(name string, typ NFTSetType, elems []NFTInterval) string {
	if !slices.ContainsFunc(w.t.Sets, func(s NFTSet) bool { return s.Name == name }) {
		w.t.Sets = append(w.t.Sets, NFTSet{Name: name, Type: typ, Elements: elems})
	}
	return name
}

// acting is ms behind the IPv4-only match a rule that acts needs when IPv6 is off.
func (w *nftWriter) acting(ms ...NFTMatch) []NFTMatch { return append(slices.Clone(w.only4), ms...) }

// perFamily calls fn for each family with addresses in list, with the set holding them.
func (w *nftWriter) perFamily(name string, list []netip.Prefix, fn func(f Family, set string, ps []netip.Prefix)) {
	for _, f := range w.r.Families {
		ps := Subnets(f, list)
		if len(ps) == 0 {
			continue
		}
		typ, suffix := NFTIPv4, "v4"
		if f == IPv6 {
			typ, suffix = NFTIPv6, "v6"
		}
		fn(f, w.addSet(name+"_"+suffix, typ, prefixIntervals(ps)), ps)
	}
}

// listComment names a rule over a whole list, e.g. "proxy-init/ignore-port-4190,4191". A list
// too long for a comment is cut short with ",...+N" (N items left out; the set holds them all).
// Only the items that can appear are rendered: lists may hold thousands of subnets.
func listComment(c StepCommon, n int, item func(int) string) string {
	head, tail := CommentPrefix+c.Name, c.NameTail
	base, marker := len(head)+len(tail), len(",...+")+len(strconv.Itoa(n))
	var items []string
	k, used := 0, 0 // k: the leading items that fit together with the marker
	for i := 0; i < n && base+used <= NFTCommentMax; i++ {
		items = append(items, item(i))
		used += len(items[i]) + min(i, 1) // a comma before every item but the first
		if base+marker+used <= NFTCommentMax {
			k = i + 1
		}
	}
	if len(items) == n && base+used <= NFTCommentMax {
		return head + strings.Join(items, ",") + tail
	}
	if k == 0 {
		return head + strconv.Itoa(n) + "-items" + tail
	}
	return head + strings.Join(items[:k], ",") + ",...+" + strconv.Itoa(n-k) + tail
}

func portIntervals(ports []PortRange) []NFTInterval {
	out := make([]NFTInterval, len(ports))
	for i, p := range ports {
		out[i] = NFTInterval{First: []byte{byte(p.First >> 8), byte(p.First)}, Last: []byte{byte(p.Last >> 8), byte(p.Last)}}
	}
	return normalize(out)
}

func prefixIntervals(ps []netip.Prefix) []NFTInterval {
	out := make([]NFTInterval, len(ps))
	for i, p := range ps {
		first := p.Masked().Addr().AsSlice()
		last := slices.Clone(first)
		for b := p.Bits(); b < len(last)*8; b++ {
			last[b/8] |= 0x80 >> (b % 8)
		}
		out[i] = NFTInterval{First: first, Last: last}
	}
	return normalize(out)
}

// NormalizeIntervals returns the intervals sorted, those that overlap or touch merged: the one
// form an nftables interval set can hold them in. The input is left untouched.
func NormalizeIntervals(in []NFTInterval) []NFTInterval { return normalize(slices.Clone(in)) }

// normalize is NormalizeIntervals on intervals the caller owns: it sorts and merges in place,
// writing no key's bytes.
func normalize(s []NFTInterval) []NFTInterval {
	slices.SortFunc(s, func(a, b NFTInterval) int { return bytes.Compare(a.First, b.First) })
	out := s[:0]
	for _, iv := range s {
		if n := len(out); n > 0 {
			last := &out[n-1]
			next, ok := last.After()
			if !ok || bytes.Compare(iv.First, next) <= 0 {
				if bytes.Compare(iv.Last, last.Last) > 0 {
					last.Last = iv.Last
				}
				continue
			}
		}
		out = append(out, iv)
	}
	return out
}

// ElementString renders one interval of set type t in nft syntax: "80", "1000-2000",
// "192.0.2.0/24", "198.51.100.7" or "203.0.113.0-203.0.113.9".
func (t NFTSetType) ElementString(iv NFTInterval) string {
	first, ok1 := netip.AddrFromSlice(iv.First)
	last, ok2 := netip.AddrFromSlice(iv.Last)
	switch {
	case t == NFTPorts && len(iv.First) == 2 && len(iv.Last) == 2:
		return PortRange{binary.BigEndian.Uint16(iv.First), binary.BigEndian.Uint16(iv.Last)}.String()
	case t == NFTPorts || !ok1 || !ok2:
		return fmt.Sprintf("<bad key %x-%x>", iv.First, iv.Last)
	case first == last:
		return first.String()
	}
	// A range that is exactly one prefix prints as the prefix, as nft does.
	if ps := rangePrefixes(first, last); len(ps) == 1 {
		return ps[0].String()
	}
	return first.String() + "-" + last.String()
}

// rangePrefixes lists the fewest prefixes that cover first to last, in order.
func rangePrefixes(first, last netip.Addr) []netip.Prefix {
	var out []netip.Prefix
	for first.IsValid() && first.BitLen() == last.BitLen() && first.Compare(last) <= 0 {
		bits := first.BitLen()
		for bits > 0 {
			p := netip.PrefixFrom(first, bits-1)
			if p.Masked().Addr() != first || lastAddr(p).Compare(last) > 0 {
				break
			}
			bits--
		}
		p := netip.PrefixFrom(first, bits)
		out = append(out, p)
		first = lastAddr(p).Next()
	}
	return out
}

func lastAddr(p netip.Prefix) netip.Addr {
	a, _ := netip.AddrFromSlice(prefixIntervals([]netip.Prefix{p})[0].Last)
	return a
}

// ElementStrings renders the set's elements in nft syntax.
func (s NFTSet) ElementStrings() []string {
	out := make([]string, len(s.Elements))
	for i, iv := range s.Elements {
		out[i] = s.Type.ElementString(iv)
	}
	return out
}

// Body renders the set's definition without its name: type, flags and elements.
func (s NFTSet) Body() string {
	return fmt.Sprintf("type %s; flags %s; elements = { %s };", s.Type, s.FlagList(), strings.Join(s.ElementStrings(), ", "))
}

// FlagList renders the set's flags in nft syntax.
func (s NFTSet) FlagList() string { return cmp.Or(s.Flags, "constant,interval") }

// Statements renders the table as nft commands, one object or rule a line, in a canonical order
// (sets, chains by name): two tables are the same exactly when their statements are.
func (t NFTTable) Statements() []string {
	tbl := NFTFamily + " " + NFTTableName
	out := []string{fmt.Sprintf("add table %s { comment %s; }", tbl, strconv.Quote(t.Comment))}
	sets := slices.Clone(t.Sets)
	slices.SortFunc(sets, func(a, b NFTSet) int { return strings.Compare(a.Name, b.Name) })
	for _, s := range sets {
		out = append(out, fmt.Sprintf("add set %s %s { %s }", tbl, s.Name, s.Body()))
	}
	chains := slices.Clone(t.Chains)
	slices.SortFunc(chains, func(a, b NFTChain) int { return strings.Compare(a.Name, b.Name) })
	for _, c := range chains {
		out = append(out, fmt.Sprintf("add chain %s %s { %s }", tbl, c.Name, c.Header()))
		for _, r := range c.Rules {
			out = append(out, fmt.Sprintf("add rule %s %s %s", tbl, c.Name, r))
		}
	}
	return out
}

// CompareNFT compares a table read back (nil: absent) with the expected one, statement by statement.
func CompareNFT(want NFTTable, have *NFTTable) Diff {
	var h []string
	if have != nil {
		h = have.Statements()
	}
	return diffLines(want.Statements(), h)
}
