package iptables

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Family is an address family the rules are written for.
type Family string

const (
	IPv4 Family = "ipv4"
	IPv6 Family = "ipv6"
)

// Contains reports whether p belongs to family f.
func (f Family) Contains(p netip.Prefix) bool {
	return p.Addr().Is4() == (f == IPv4)
}

// Chain and table names shared with Linkerd's proxy-init: tools and runbooks look for them.
const (
	Table         = "nat"
	RedirectChain = "PROXY_INIT_REDIRECT"
	OutputChain   = "PROXY_INIT_OUTPUT"
	CommentPrefix = "proxy-init/"
)

// The chains of the features beyond Linkerd's, each named for its table and hook, so no name is
// in two tables and a chain's name says where it is.
const (
	MangleChain        = "PROXY_INIT_MANGLE_PREROUTING"
	RawPreroutingChain = "PROXY_INIT_RAW_PREROUTING"
	RawOutputChain     = "PROXY_INIT_RAW_OUTPUT"
)

// CloseWaitSysctl is the per-namespace conntrack CLOSE_WAIT timeout that CloseWaitSecs sets.
const CloseWaitSysctl = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"

// maxMultiportPorts is the xt_multiport limit: 15 ports per rule, a range counting as two.
const maxMultiportPorts = 15

// Ruleset is the validated plan both backends write. Lists are deduplicated in the user's order;
// subnet lists hold both families.
type Ruleset struct {
	Families          []Family
	InboundProxyPort  uint16
	OutboundProxyPort uint16
	ProxyUID          int // -1: none
	ProxyGID          int // -1: none
	// RedirectPorts is empty when every inbound port is redirected.
	RedirectPorts         []PortRange
	InboundIgnorePorts    []PortRange
	OutboundIgnorePorts   []PortRange
	InboundIgnoreSubnets  []netip.Prefix
	OutboundIgnoreSubnets []netip.Prefix
	// CloseWaitSecs, when positive, is the conntrack CLOSE_WAIT timeout the namespace gets. It
	// is no rule, and not part of Hash.
	CloseWaitSecs int64

	// IPv6Auto leaves IPv6 to be decided where the rules are written (ForIPv6); Families has both.
	IPv6Auto bool `json:",omitempty"`
	// DNSPort, when non-zero, is where the pod's DNS is redirected; DNSServers, when given,
	// limit that to these nameservers (both families).
	DNSPort    uint16       `json:",omitempty"`
	DNSServers []netip.Addr `json:",omitempty"`
	// TPROXY delivers inbound TCP with TPROXY instead of REDIRECT.
	TPROXY bool `json:",omitempty"`
	// OutboundRedirectPorts and OutboundRedirectSubnets, if any, are the only outbound redirected.
	OutboundRedirectPorts   []PortRange    `json:",omitempty"`
	OutboundRedirectSubnets []netip.Prefix `json:",omitempty"`
	IgnoreInterfaces        []string       `json:",omitempty"`
	IgnoreUIDs              []uint32       `json:",omitempty"`
	IgnoreGIDs              []uint32       `json:",omitempty"`
	DropInvalid             bool           `json:",omitempty"`
	// RerouteInterfaces are a virtual machine's interfaces, whose TCP goes to the outbound port.
	RerouteInterfaces []string `json:",omitempty"`

	// saved caches Saved per family: rendering a thousand rules more than once is a visible part
	// of a one-shot run. Nil (a Ruleset decoded from JSON, or made by hand) renders each time.
	saved *savedCache
}

type savedCache [2]struct {
	once sync.Once
	s    SavedState
}

// ForIPv6 returns the ruleset with IPv6 rules (on) or without, and IPv6 no longer left to be
// decided: what an IPv6Auto ruleset writes once the namespace has been looked at.
func (r *Ruleset) ForIPv6(on bool) *Ruleset {
	c := *r
	c.IPv6Auto = false
	c.saved = new(savedCache)
	c.Families = []Family{IPv4}
	if on {
		c.Families = append(c.Families, IPv6)
	}
	return &c
}

// HasFamily reports whether rules are written for f.
func (r *Ruleset) HasFamily(f Family) bool { return slices.Contains(r.Families, f) }

// Subnets returns the members of list in family f, so a v4 CIDR never reaches the v6 rules.
func Subnets(f Family, list []netip.Prefix) []netip.Prefix {
	return byFamily([]Family{f}, list, func(p netip.Prefix) bool { return p.Addr().Is4() })
}

// Rule is one iptables rule in the canonical form iptables-save prints, so that what we render and
// what we read back compare as plain strings.
type Rule struct {
	// Table is the rule's table; empty is nat.
	Table string
	Chain string
	// Spec is everything after "-A <chain> ", comment included.
	Spec string
}

// String renders the rule as an iptables-save line ("-A <chain>" alone without a spec), behind
// "-t <table> " outside the nat table, so that one list can hold every table's lines.
func (r Rule) String() string {
	t := ""
	if r.Table != "" && r.Table != Table {
		t = "-t " + r.Table + " "
	}
	if r.Spec == "" {
		return t + "-A " + r.Chain
	}
	return t + "-A " + r.Chain + " " + r.Spec
}

// writeTo writes the rule as a restore command (verb "-A " or "-D ") and a newline.
func (r Rule) writeTo(b *strings.Builder, verb string) {
	b.WriteString(verb)
	b.WriteString(r.Chain)
	if r.Spec != "" {
		b.WriteByte(' ')
		b.WriteString(r.Spec)
	}
	b.WriteByte('\n')
}

// XTRule is one iptables rule of ours in structured form: Rule renders the line iptables-save
// prints for it, and the iptables-nft netlink writer encodes the same fields.
type XTRule struct {
	// Table is the rule's table; empty is nat.
	Table string
	Chain string
	// Source and Destination are -s and -d; the zero Prefix matches any address.
	Source, Destination netip.Prefix
	// InInterface and OutInterface are -i and -o.
	InInterface, OutInterface string
	// TCP is -p tcp, UDP -p udp.
	TCP, UDP bool
	// UIDOwner and GIDOwner are -m owner --uid-owner / --gid-owner; nil matches any socket.
	UIDOwner, GIDOwner *uint32
	// MultiportDPorts is -m multiport --dports (at most 15 ports, a range counting two).
	MultiportDPorts []PortRange
	// DPort and SPort are -m tcp (or -m udp) --dport and --sport, when First is non-zero.
	DPort, SPort PortRange
	// CTState is -m conntrack --ctstate: a CTState* value, or empty.
	CTState string
	// Comment is -m comment --comment, prefix included.
	Comment string
	// Target is RETURN, DROP, REDIRECT (to ToPort), TPROXY (to ToPort, marking Mark), CT (into
	// conntrack zone Zone) or the chain to jump to.
	Target string
	ToPort uint16
	// OnIP is TPROXY's --on-ip: the family's unspecified address, which keeps the destination.
	OnIP netip.Addr
	Mark uint32
	Zone uint16
}

// The conntrack states our rules match, as iptables-save spells them.
const (
	CTStateInvalid     = "INVALID"
	CTStateEstablished = "RELATED,ESTABLISHED"
)

// TableName is the rule's table: nat when Table is empty.
func (r XTRule) TableName() string { return cmp.Or(r.Table, Table) }

// Rule renders r the way iptables-save prints it: the options in iptables' canonical order, and
// no -s or -d for a /0 prefix, which matches every address and which iptables-save leaves out.
func (r XTRule) Rule() Rule {
	var b strings.Builder
	opt := func(on bool, parts ...string) {
		if !on {
			return
		}
		for _, p := range parts {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(p)
		}
	}
	proto := ""
	if r.TCP {
		proto = "tcp"
	} else if r.UDP {
		proto = "udp"
	}
	opt(r.Source.IsValid() && r.Source.Bits() > 0, "-s", r.Source.String())
	opt(r.Destination.IsValid() && r.Destination.Bits() > 0, "-d", r.Destination.String())
	opt(r.InInterface != "", "-i", r.InInterface)
	opt(r.OutInterface != "", "-o", r.OutInterface)
	opt(proto != "", "-p", proto)
	if r.UIDOwner != nil {
		opt(true, "-m", "owner", "--uid-owner", strconv.FormatUint(uint64(*r.UIDOwner), 10))
	}
	if r.GIDOwner != nil {
		opt(true, "-m", "owner", "--gid-owner", strconv.FormatUint(uint64(*r.GIDOwner), 10))
	}
	opt(len(r.MultiportDPorts) > 0, "-m", "multiport", "--dports", joinXTPorts(r.MultiportDPorts))
	opt(r.DPort.First != 0 || r.SPort.First != 0, "-m", proto)
	opt(r.SPort.First != 0, "--sport", xtPorts(r.SPort))
	opt(r.DPort.First != 0, "--dport", xtPorts(r.DPort))
	opt(r.CTState != "", "-m", "conntrack", "--ctstate", r.CTState)
	// Names never hold quotes or backslashes, so plain quoting matches what iptables-save prints.
	opt(true, "-m", "comment", "--comment", "\""+r.Comment+"\"", "-j", r.Target)
	switch r.Target {
	case TargetRedirect:
		opt(true, "--to-ports", strconv.Itoa(int(r.ToPort)))
	case TargetTPROXY:
		opt(true, "--on-port", strconv.Itoa(int(r.ToPort)), "--on-ip", r.OnIP.String(),
			"--tproxy-mark", fmt.Sprintf("%#x/0xffffffff", r.Mark))
	case TargetCT:
		opt(true, "--zone", strconv.Itoa(int(r.Zone)))
	}
	return Rule{Table: r.TableName(), Chain: r.Chain, Spec: b.String()}
}

// Targets of our rules other than jumps to our chains.
const (
	TargetReturn   = "RETURN"
	TargetRedirect = "REDIRECT"
	TargetDrop     = "DROP"
	TargetTPROXY   = "TPROXY"
	TargetCT       = "CT"
)

// XTRules returns the iptables rules inside our chains for family f, in plan order. Each step
// is one rule, or over a list one per multiport group of 15 ports or per item of f.
func (r *Ruleset) XTRules(f Family) []XTRule {
	// Sized up front for this family's subnets: a cold process pays for every page it touches.
	n := len(r.RedirectPorts) + 16
	for _, list := range [][]netip.Prefix{r.InboundIgnoreSubnets, r.OutboundIgnoreSubnets} {
		for _, p := range list {
			if f.Contains(p) {
				n++
			}
		}
	}
	out := make([]XTRule, 0, n)
	for _, c := range r.Plan() {
		for _, s := range c.Steps {
			x := XTRule{Table: c.Table.Name, Chain: c.Name, Target: TargetReturn, InInterface: s.Common().Arriving}
			out = s.xtRules(out, x, f)
		}
	}
	return out
}

// XTJumps returns the rules that hook the plan's chains into the built-in chains, in
// iptables-save order (by table, then hook), the same for both families.
func (r *Ruleset) XTJumps() []XTRule {
	return xtJumps(r.Plan())
}

func xtJumps(chains []PlanChain) []XTRule {
	var out []XTRule
	for _, t := range XTTables() {
		for _, c := range chains {
			if c.Table != t {
				continue
			}
			out = append(out, XTRule{Table: t.Name, Chain: c.Hook.Builtin, Comment: CommentPrefix + c.JumpName, Target: c.Name})
		}
	}
	return out
}

// Saved returns what iptables-save shows of ours in family f once rs is applied, table by table
// in its order: the jumps (built-in chains print first), then our chains' rules by chain name.
// It is empty for a family rs does not write, and shared: callers must not modify it.
func (r *Ruleset) Saved(f Family) SavedState {
	if !r.HasFamily(f) {
		return SavedState{}
	}
	if r.saved == nil {
		return r.renderSaved(f)
	}
	c := &r.saved[0]
	if f == IPv6 {
		c = &r.saved[1]
	}
	c.once.Do(func() { c.s = r.renderSaved(f) })
	return c.s
}

func (r *Ruleset) renderSaved(f Family) SavedState {
	rules := r.XTRules(f)
	jumps := r.XTJumps()
	s := SavedState{Rules: make([]string, 0, len(rules)+len(jumps))}
	for _, t := range XTTables() {
		var names []string
		for _, j := range jumps {
			if j.TableName() == t.Name {
				s.Rules = append(s.Rules, j.Rule().String())
				names = append(names, j.Target)
			}
		}
		// iptables-save prints user chains sorted by name: PROXY_INIT_OUTPUT before PROXY_INIT_REDIRECT.
		slices.Sort(names)
		s.Chains = append(s.Chains, names...)
		for _, name := range names {
			for _, rl := range rules {
				if rl.Chain == name {
					s.Rules = append(s.Rules, rl.Rule().String())
				}
			}
		}
	}
	return s
}

// Hash identifies the plan, so a backend can skip an identical re-run. It hashes the fields, far
// cheaper than rendering the rules; FNV serves, as it guards against accidents, not adversaries,
// and a cryptographic hash would add its initialisation to every run. The fields beyond
// Linkerd's are hashed only when one is set, so a Linkerd configuration keeps its old hash.
func (r *Ruleset) Hash() string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%v|%d|%d|%d|%d|%v|%v|%v|", r.Families, r.InboundProxyPort, r.OutboundProxyPort,
		r.ProxyUID, r.ProxyGID, r.RedirectPorts, r.InboundIgnorePorts, r.OutboundIgnorePorts)
	// Subnets are hashed by family, of the families written: how the families' items interleave
	// changes no rule, so must not change the plan (show rebuilds it family by family).
	is4 := func(p netip.Prefix) bool { return p.Addr().Is4() }
	for _, list := range [][]netip.Prefix{r.InboundIgnoreSubnets, r.OutboundIgnoreSubnets} {
		for _, p := range byFamily(r.Families, list, is4) {
			h.Write([]byte(p.String() + ","))
		}
		h.Write([]byte("|"))
	}
	if r.DNSPort != 0 || r.TPROXY || r.DropInvalid || len(r.OutboundRedirectPorts) > 0 || len(r.OutboundRedirectSubnets) > 0 ||
		len(r.IgnoreInterfaces) > 0 || len(r.IgnoreUIDs) > 0 || len(r.IgnoreGIDs) > 0 {
		fmt.Fprintf(h, "beyond|%d|%v|%t|%v|%v|%q|%v|%v|%t|", r.DNSPort, byFamily(r.Families, r.DNSServers, netip.Addr.Is4), r.TPROXY, r.OutboundRedirectPorts,
			byFamily(r.Families, r.OutboundRedirectSubnets, is4), r.IgnoreInterfaces, r.IgnoreUIDs, r.IgnoreGIDs, r.DropInvalid)
	}
	// Hashed apart, so that a plan without them keeps the hash it had before they existed.
	if len(r.RerouteInterfaces) > 0 {
		fmt.Fprintf(h, "reroute|%q|", r.RerouteInterfaces)
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// byFamily returns the items of list in the families fams, IPv4's first, each in order.
func byFamily[T any](fams []Family, list []T, is4 func(T) bool) []T {
	var out []T
	for _, f := range fams {
		for _, v := range list {
			if is4(v) == (f == IPv4) {
				out = append(out, v)
			}
		}
	}
	return out
}

// joinXTPorts renders a multiport argument list: "4190,4191,6000:7000".
func joinXTPorts(ports []PortRange) string {
	parts := make([]string, len(ports))
	for i, p := range ports {
		parts[i] = xtPorts(p)
	}
	return strings.Join(parts, ",")
}

// multiportGroups splits ports into multiport lists of at most 15 ports, a range counting two.
func multiportGroups(ports []PortRange) [][]PortRange {
	var groups [][]PortRange
	start, n := 0, 0
	for i, p := range ports {
		cost := 1
		if p.First != p.Last {
			cost = 2
		}
		if n+cost > maxMultiportPorts {
			groups = append(groups, ports[start:i])
			start, n = i, 0
		}
		n += cost
	}
	if start < len(ports) {
		groups = append(groups, ports[start:])
	}
	return groups
}
