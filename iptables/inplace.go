package iptables

// Reading the rules in place without the configuration (`proxy-init show` without rule flags):
// every rule of ours names its step in its comment and holds the step's values in its matches,
// so the configuration that wrote them can be rebuilt, rendered again and compared with what is
// in place, which says whether the rules are whole.

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kubemesh/proxy-init/internal/badinput"
)

// Holding is what of ours one backend holds, as read back.
type Holding struct {
	Backend Backend
	// PerFamily is set when the backend is written one transaction per family (the iptables
	// binaries): only then can a run stopped midway leave one family without the other.
	PerFamily bool
	// Saved is an iptables backend's rules of ours, per family.
	Saved map[Family]SavedState
	// Table is the native table, nil when absent; Other counts its objects beyond chains and sets.
	Table *NFTTable
	Other int
}

// Elsewhere is what of ours the holding has, as Applier.Present lists it: none, or its lines.
func (h Holding) Elsewhere() []Elsewhere {
	lines := append(h.Saved[IPv4].Present(IPv4), h.Saved[IPv6].Present(IPv6)...)
	if h.Table != nil {
		lines = h.Table.Statements()
	}
	if len(lines) == 0 {
		return nil
	}
	return []Elsewhere{{Backend: h.Backend, Rules: lines}}
}

// OtherObjects is the line a diff gets for n objects in the native table beyond chains and sets.
func OtherObjects(n int) string {
	return fmt.Sprintf("%d other objects in table %s %s (named counters, quotas, limits or flowtables)",
		n, NFTFamily, NFTTableName)
}

// InPlace is what of ours a namespace holds: each backend's rules, and the policy routing.
type InPlace struct {
	Holdings []Holding
	Routes   []string
}

// Found is what Inspect makes of the rules in place.
type Found struct {
	// Backend holds the rules; empty when no backend holds anything of ours.
	Backend   Backend
	PerFamily bool
	// Families are the rules in place and their difference from what Rules writes: ipv4 and
	// ipv6 for an iptables backend, inet for the native table.
	Families []FamilyState
	// Rules is the configuration the rules were written from; nil when none can be told.
	Rules     *Ruleset
	Elsewhere []Elsewhere
	Routes    *RouteState
	// Notes explain what is whole but may surprise (a family without rules, and why).
	Notes []string
	// Problems say why the rules are not whole; none when they are.
	Problems []string
}

// Whole reports whether our rules are in place, exactly as their configuration writes them, only.
func (f Found) Whole() bool { return f.Backend != "" && len(f.Problems) == 0 }

// inspectOrder is auto's: of several backends holding rules, the first holds them, the rest leftovers.
var inspectOrder = []Backend{BackendNFT, BackendNFTables, BackendLegacy}

// Inspect tells, from what a namespace holds, which backend holds our rules, the configuration
// they were written from, and whether they are whole. It never names a cause the backend makes
// impossible (a run stopped between families, in a backend written in one transaction).
func Inspect(in InPlace) Found {
	var f Found
	hs := slices.Clone(in.Holdings)
	slices.SortStableFunc(hs, func(a, b Holding) int {
		return slices.Index(inspectOrder, a.Backend) - slices.Index(inspectOrder, b.Backend)
	})
	var main Holding
	for _, h := range hs {
		switch els := h.Elsewhere(); {
		case els == nil: // holds nothing of ours
		case f.Backend == "":
			f.Backend, f.PerFamily, main = h.Backend, h.PerFamily, h
		default:
			f.Elsewhere = append(f.Elsewhere, els...)
			f.Problems = append(f.Problems, fmt.Sprintf("%s also holds rules of ours, left by a run in another mode (apply or cleanup removes them)", h.Backend))
		}
	}
	if f.Backend == "" {
		f.Problems = append(f.Problems, "no backend holds rules of ours: nothing redirects this namespace's traffic")
	} else if main.Table != nil {
		f.inspectNative(main)
	} else {
		f.inspectXT(main)
	}
	f.Routes = CompareRoutes(f.Rules.PolicyRoutes(), in.Routes)
	if f.Routes != nil && !f.Routes.Diff.Empty() {
		f.Problems = append(f.Problems, "the policy routing differs from what the configuration needs (TPROXY's)")
	}
	return f
}

func (f *Found) inspectXT(h Holding) {
	c := NewConfig()
	v4, v6 := len(h.Saved[IPv4].Rules) > 0, len(h.Saved[IPv6].Rules) > 0
	c.IPv6 = v6
	for _, fam := range []Family{IPv4, IPv6} {
		for _, l := range h.Saved[fam].Rules {
			c.absorb(xtFacts(l))
		}
	}
	rs := f.build(c)
	for _, fam := range []Family{IPv4, IPv6} {
		st := FamilyState{Family: fam, Rules: h.Saved[fam].Rules}
		if rs != nil {
			st.Diff = rs.Compare(fam, h.Saved[fam])
		}
		f.Families = append(f.Families, st)
		if len(st.Rules) > 0 {
			f.diffProblems(st)
		}
	}
	switch {
	case v4 && !v6 && h.PerFamily:
		f.Notes = append(f.Notes, fmt.Sprintf("ipv6 holds none of our rules: written with --ipv6=false, or a run was stopped between the two families' transactions (%s writes one per family); if the pod should have IPv6 rules, apply again", h.Backend))
	case v4 && !v6:
		f.Notes = append(f.Notes, fmt.Sprintf("ipv6 holds none of our rules: written with --ipv6=false (%s's rules are written in one transaction for both families, so no run was cut short)", h.Backend))
	case !v4 && v6 && h.PerFamily:
		f.Problems = append(f.Problems, fmt.Sprintf("ipv4 holds none of our rules but ipv6 does: a run was stopped between the two families' transactions (%s writes one per family; cleanup removes ipv4 first): apply again, or clean up", h.Backend))
	case !v4 && v6:
		f.Problems = append(f.Problems, fmt.Sprintf("ipv4 holds none of our rules but ipv6 does: they were removed by something else (%s's rules are written and removed in one transaction for both families)", h.Backend))
	}
}

func (f *Found) inspectNative(h Holding) {
	t := h.Table
	c, unordered := nftConfig(t)
	rs := f.build(c)
	st := FamilyState{Family: FamilyInet, Rules: t.Statements()}
	tableLine := ""
	if rs != nil {
		want := rs.NFT()
		if unordered && want.Comment != t.Comment {
			want.Comment = t.Comment
			f.Notes = append(f.Notes, "the table's recorded plan cannot be checked: a list too long for its rule comment is held in a set, which keeps no order")
		}
		st.Diff = CompareNFT(want, t)
		if want.Comment != t.Comment {
			tableLine = want.Statements()[0]
			f.Problems = append(f.Problems, fmt.Sprintf("the table records the plan %q, but its rules are those of %q: it was changed after it was written", t.Comment, want.Comment))
		}
	}
	if h.Other > 0 {
		st.Diff.Extra = append(st.Diff.Extra, OtherObjects(h.Other))
	}
	f.Families = append(f.Families, st)
	d := st.Diff
	if tableLine != "" { // reported above
		d.Missing = slices.DeleteFunc(slices.Clone(d.Missing), func(l string) bool { return l == tableLine })
		d.Extra = slices.DeleteFunc(slices.Clone(d.Extra), func(l string) bool { return l == st.Rules[0] })
	}
	f.diffProblems(FamilyState{Family: FamilyInet, Diff: d})
	if !c.IPv6 {
		f.Notes = append(f.Notes, "the table acts on ipv4 only: written with --ipv6=false (the native table is written whole in one transaction, so no run was cut short)")
	}
}

// build builds the configuration read from the rules, or says why they make none.
func (f *Found) build(c Config) *Ruleset {
	rs, err := Build(c)
	if e, ok := badinput.As(err); ok {
		for _, p := range e.Problems {
			f.Problems = append(f.Problems, fmt.Sprintf("the rules in place make no whole configuration: %s %q: %s", p.Field, p.Value, p.Reason))
		}
		return nil
	}
	f.Rules = rs
	return rs
}

// diffProblems says how a family's rules differ from what the configuration writes.
func (f *Found) diffProblems(st FamilyState) {
	jumps := 0
	for _, l := range st.Diff.Missing {
		if strings.HasPrefix(l, "-") && !IsOurChain(savedRule(l).Chain) {
			jumps++
		}
	}
	rules := len(st.Diff.Missing) - jumps
	if jumps > 0 {
		f.Problems = append(f.Problems, fmt.Sprintf("%s lacks %d of the jumps into our chains: packets never reach their rules", st.Family, jumps))
	}
	if rules > 0 {
		f.Problems = append(f.Problems, fmt.Sprintf("%s lacks %d of the lines that configuration writes", st.Family, rules))
	}
	if n := len(st.Diff.Extra); n > 0 {
		f.Problems = append(f.Problems, fmt.Sprintf("%s holds %d lines that configuration does not write", st.Family, n))
	}
	if st.Diff.Reordered {
		f.Problems = append(f.Problems, fmt.Sprintf("%s holds the rules out of order", st.Family))
	}
}

// ruleFacts is what one rule of ours says about the configuration it was written from.
type ruleFacts struct {
	chain string
	// name is the rule's name: its comment without the prefix, or for a rule over a list the
	// part before the items (listNames).
	name    string
	ports   []string // as the user writes them: "80", "1000-2000"
	subnets []string
	id      uint32
	iface   string
	toPort  int
}

// listNames are the names of the rules over a list, before and after the items.
var listNames = [][2]string{
	{"ignore-port-", ""}, {"ignore-subnet-", ""},
	{"redirect-port-", "-to-proxy-port"}, {"tproxy-port-", "-to-proxy-port"},
	{"redirect-outbound-port-", "-to-proxy-port"}, {"redirect-outbound-subnet-", "-to-proxy-port"},
	{"redirect-dns-udp-", ""}, {"redirect-dns-tcp-", ""}, {"dns-zone-captured-", ""},
	{ReroutePrefix + "ignore-port-", ""}, {ReroutePrefix + "ignore-subnet-", ""},
	{ReroutePrefix + "redirect-outbound-port-", "-to-proxy-port"}, {ReroutePrefix + "redirect-outbound-subnet-", "-to-proxy-port"},
}

// splitName splits a rule comment into its name and, for a rule over a list, the items it
// names; cut is set when the comment was too long for every item (NFT's listComment).
func splitName(comment string) (name string, items []string, cut bool) {
	name = strings.TrimPrefix(comment, CommentPrefix)
	for _, n := range listNames {
		mid, ok := strings.CutPrefix(name, n[0])
		if mid, ok2 := strings.CutSuffix(mid, n[1]); ok && ok2 && mid != "" {
			cut = strings.Contains(mid, ",...+") || strings.HasSuffix(mid, "-items")
			return n[0], strings.Split(mid, ","), cut
		}
	}
	return name, nil, false
}

// absorb adds what one rule says to c; Build drops the repeats of lists absorbed more than once.
func (c *Config) absorb(r ruleFacts) {
	// A rerouted interface's rules name its interface, and repeat the outbound steps.
	if name, ok := strings.CutPrefix(r.name, ReroutePrefix); ok && r.chain != OutputChain {
		c.RerouteVirtualInterfaces = append(c.RerouteVirtualInterfaces, r.iface)
		if strings.HasPrefix(r.name, RerouteInterfacePrefix) {
			return
		}
		r.chain, r.name = OutputChain, name
	}
	switch r.chain {
	case RedirectChain, MangleChain:
		switch r.name {
		case "ignore-port-":
			c.InboundPortsToIgnore = append(c.InboundPortsToIgnore, r.ports...)
		case "ignore-subnet-":
			c.InboundSubnetsToIgnore = append(c.InboundSubnetsToIgnore, r.subnets...)
		case "redirect-all-incoming-to-proxy-port", "redirect-port-":
			c.InboundProxyPort = r.toPort
			c.PortsToRedirect = append(c.PortsToRedirect, r.ports...)
		case "tproxy-all-incoming-to-proxy-port", "tproxy-port-":
			c.InboundProxyPort, c.InboundMode = r.toPort, InboundTPROXY
			c.PortsToRedirect = append(c.PortsToRedirect, r.ports...)
		case "drop-invalid":
			c.DropInvalid = true
		}
	case OutputChain:
		switch {
		case r.name == "ignore-proxy-user-id":
			c.ProxyUID = int(r.id)
		case r.name == "ignore-proxy-group-id":
			c.ProxyGID = int(r.id)
		case strings.HasPrefix(r.name, "ignore-user-id-"):
			c.UIDsToIgnore = append(c.UIDsToIgnore, strconv.FormatUint(uint64(r.id), 10))
		case strings.HasPrefix(r.name, "ignore-group-id-"):
			c.GIDsToIgnore = append(c.GIDsToIgnore, strconv.FormatUint(uint64(r.id), 10))
		case strings.HasPrefix(r.name, "redirect-dns-"):
			c.RedirectDNSToPort = r.toPort
			for _, s := range r.subnets {
				c.DNSServersOnly = true
				c.DNSServers = append(c.DNSServers, strings.TrimSuffix(strings.TrimSuffix(s, "/32"), "/128"))
			}
		case r.name == "ignore-port-":
			c.OutboundPortsToIgnore = append(c.OutboundPortsToIgnore, r.ports...)
		case r.name == "ignore-subnet-":
			c.OutboundSubnetsToIgnore = append(c.OutboundSubnetsToIgnore, r.subnets...)
		case r.name == "redirect-all-outgoing-to-proxy-port", // which lists no ports or subnets
			r.name == "redirect-outbound-port-", r.name == "redirect-outbound-subnet-":
			c.OutboundProxyPort = r.toPort
			c.OutboundPortsToRedirect = append(c.OutboundPortsToRedirect, r.ports...)
			c.OutboundSubnetsToRedirect = append(c.OutboundSubnetsToRedirect, r.subnets...)
		}
	}
	if strings.HasPrefix(r.name, "ignore-interface-") {
		c.InterfacesToIgnore = append(c.InterfacesToIgnore, r.iface)
	}
}

// xtFacts reads a line as XTRule.Rule renders it.
func xtFacts(line string) ruleFacts {
	rl := savedRule(line)
	r := ruleFacts{chain: rl.Chain}
	f := strings.Fields(rl.Spec)
	for i := 0; i+1 < len(f); i++ {
		arg := f[i+1]
		switch f[i] {
		case "-s", "-d":
			if p, err := netip.ParsePrefix(arg); err == nil {
				r.subnets = append(r.subnets, p.String())
			}
		case "-i", "-o":
			r.iface = arg
		case "--uid-owner", "--gid-owner":
			n, _ := strconv.ParseUint(arg, 10, 32)
			r.id = uint32(n)
		case "--dports", "--dport":
			for _, p := range strings.Split(arg, ",") {
				pr, _ := ParsePort(strings.Replace(p, ":", "-", 1))
				r.ports = append(r.ports, pr.String())
			}
		case "--comment":
			r.name, _, _ = splitName(strings.Trim(arg, `"`))
		case "--to-ports", "--on-port":
			n, _ := strconv.ParseUint(arg, 10, 16)
			r.toPort = int(n)
		default:
			continue
		}
		i++
	}
	return r
}

// nftConfig reads the configuration back from the native table. Lists come from the rule
// comments, in order, or where one was cut short from the sets, which keep none: unordered.
func nftConfig(t *NFTTable) (c Config, unordered bool) {
	c = NewConfig()
	c.IPv6 = true
	sets := map[string]NFTSet{}
	for _, s := range t.Sets {
		sets[s.Name] = s
	}
	for _, ch := range t.Chains {
		for _, rl := range ch.Rules {
			name, items, cut := splitName(rl.Comment)
			r := ruleFacts{chain: ch.Name, name: name, toPort: int(rl.RedirectPort)}
			var portSet, addrSet []string
			for _, m := range rl.Matches {
				switch m.Kind {
				case NFTMatchNFProto:
					c.IPv6 = c.IPv6 && m.Family != IPv4
				case NFTMatchDPortSet:
					portSet = sets[m.Set].ElementStrings()
				case NFTMatchSAddrSet, NFTMatchDAddrSet:
					addrSet = setPrefixes(sets[m.Set])
				case NFTMatchSkUID, NFTMatchSkGID:
					r.id = m.ID
				case NFTMatchIIFName, NFTMatchOIFName:
					r.iface = m.Name
				}
			}
			// The comment names the ports of a port set, else the addresses; the rest is in sets.
			r.ports, r.subnets = portSet, addrSet
			ordered := items != nil && !cut
			if ordered && portSet != nil {
				r.ports = items
			} else if len(portSet) > 1 {
				unordered = true
			}
			if ordered && portSet == nil {
				r.subnets = items
			} else if len(addrSet) > 1 {
				unordered = true
			}
			for i, p := range r.ports {
				r.ports[i] = strings.Replace(p, ":", "-", 1)
			}
			c.absorb(r)
		}
	}
	return c, unordered
}

// setPrefixes lists an address set's elements as the fewest prefixes covering each.
func setPrefixes(s NFTSet) []string {
	var out []string
	for _, iv := range s.Elements {
		first, _ := netip.AddrFromSlice(iv.First)
		last, _ := netip.AddrFromSlice(iv.Last) // a bad key is no address: rangePrefixes makes none
		out = append(out, strs(rangePrefixes(first, last))...)
	}
	return out
}

// Args renders the ruleset as the proxy-init flags that write it, leaving out defaults (and the
// nameservers, which --dns-servers-only reads from /etc/resolv.conf).
func (r *Ruleset) Args() []string {
	var a []string
	flag := func(on bool, field string, value ...string) {
		if on {
			a = append(append(a, "--"+field), value...)
		}
	}
	list := func(field string, items []string) { flag(len(items) > 0, field, strings.Join(items, ",")) }
	flag(true, FieldInboundProxyPort, strconv.Itoa(int(r.InboundProxyPort)))
	flag(true, FieldOutboundProxyPort, strconv.Itoa(int(r.OutboundProxyPort)))
	flag(r.ProxyUID >= 0, FieldProxyUID, strconv.Itoa(r.ProxyUID))
	flag(r.ProxyGID >= 0, FieldProxyGID, strconv.Itoa(r.ProxyGID))
	list(FieldPortsToRedirect, strs(r.RedirectPorts))
	list(FieldInboundPortsToIgnore, strs(r.InboundIgnorePorts))
	list(FieldOutboundPortsToIgnore, strs(r.OutboundIgnorePorts))
	list(FieldInboundSubnetsToIgnore, strs(r.InboundIgnoreSubnets))
	list(FieldOutboundSubnetsToIgnore, strs(r.OutboundIgnoreSubnets))
	flag(!r.HasFamily(IPv6), FieldIPv6+"=false")
	flag(r.DNSPort != 0, FieldRedirectDNS, strconv.Itoa(int(r.DNSPort)))
	flag(len(r.DNSServers) > 0, FieldDNSServersOnly)
	flag(r.TPROXY, FieldInboundMode, string(InboundTPROXY))
	list(FieldOutboundPortsToRedirect, strs(r.OutboundRedirectPorts))
	list(FieldOutboundSubnetsToRedirect, strs(r.OutboundRedirectSubnets))
	list(FieldInterfacesToIgnore, r.IgnoreInterfaces)
	list(FieldRerouteVirtualInterfaces, r.RerouteInterfaces)
	list(FieldUIDsToIgnore, strs(r.IgnoreUIDs))
	list(FieldGIDsToIgnore, strs(r.IgnoreGIDs))
	flag(r.DropInvalid, FieldDropInvalid)
	return a
}

func strs[T any](items []T) []string {
	out := make([]string, len(items))
	for i, v := range items {
		out[i] = fmt.Sprint(v)
	}
	return out
}
