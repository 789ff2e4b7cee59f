package iptables

import (
	"fmt"
	"hash/fnv"
	"net/netip"
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

// CloseWaitSysctl is the conntrack CLOSE_WAIT timeout a ruleset with CloseWaitSecs sets, per
// network namespace.
const CloseWaitSysctl = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"

// maxMultiportPorts is the xt_multiport limit: 15 ports per rule, a range counting as two.
const maxMultiportPorts = 15

// Ruleset is the validated, normalized plan both backends write. Every list is deduplicated and
// keeps the user's order; subnet lists hold both families and are split with Subnets.
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

	// saved caches Saved per family: apply, compare and payloads all need the same lines, and
	// rendering a thousand rules more than once is a visible part of a one-shot run.
	saved [2]struct {
		once sync.Once
		s    SavedState
	}
}

// HasFamily reports whether rules are written for f.
func (r *Ruleset) HasFamily(f Family) bool {
	for _, g := range r.Families {
		if g == f {
			return true
		}
	}
	return false
}

// Subnets returns the members of list that belong to family f, so a v4 CIDR never reaches the
// v6 rules.
func Subnets(f Family, list []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range list {
		if f.Contains(p) {
			out = append(out, p)
		}
	}
	return out
}

// Rule is one iptables rule in the canonical form iptables-save prints, so that what we render and
// what we read back compare as plain strings.
type Rule struct {
	Chain string
	// Spec is everything after "-A <chain> ", comment included.
	Spec string
}

// String renders the rule as an iptables-save line; a rule without matches or target is
// "-A <chain>", with no trailing space, as iptables-save prints it.
func (r Rule) String() string {
	if r.Spec == "" {
		return "-A " + r.Chain
	}
	return "-A " + r.Chain + " " + r.Spec
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

// XTRule is one iptables rule of ours in structured form. Its Rule is the line iptables-save
// prints for it; a writer that speaks iptables-nft's netlink representation encodes the same
// fields. Only the fields a rule uses are set.
type XTRule struct {
	Chain string
	// Source and Destination are -s and -d; the zero Prefix matches any address.
	Source, Destination netip.Prefix
	// OutInterface is -o.
	OutInterface string
	// TCP is -p tcp.
	TCP bool
	// UIDOwner and GIDOwner are -m owner --uid-owner / --gid-owner; nil matches any socket.
	UIDOwner, GIDOwner *uint32
	// MultiportDPorts is -m multiport --dports (at most 15 ports, a range counting two).
	MultiportDPorts []PortRange
	// DPort is -m tcp --dport, when First is non-zero.
	DPort PortRange
	// Comment is -m comment --comment, prefix included.
	Comment string
	// Target is RETURN, REDIRECT (to ToPort) or the chain to jump to.
	Target string
	ToPort uint16
}

// Rule renders r the way iptables-save prints it: the options in iptables' canonical order, and
// no -s or -d for a /0 prefix, which matches every address and which iptables-save leaves out.
func (r XTRule) Rule() Rule {
	var b strings.Builder
	opt := func(parts ...string) {
		for _, p := range parts {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			b.WriteString(p)
		}
	}
	if r.Source.IsValid() && r.Source.Bits() > 0 {
		opt("-s", r.Source.String())
	}
	if r.Destination.IsValid() && r.Destination.Bits() > 0 {
		opt("-d", r.Destination.String())
	}
	if r.OutInterface != "" {
		opt("-o", r.OutInterface)
	}
	if r.TCP {
		opt("-p", "tcp")
	}
	if r.UIDOwner != nil {
		opt("-m", "owner", "--uid-owner", strconv.FormatUint(uint64(*r.UIDOwner), 10))
	}
	if r.GIDOwner != nil {
		opt("-m", "owner", "--gid-owner", strconv.FormatUint(uint64(*r.GIDOwner), 10))
	}
	if len(r.MultiportDPorts) > 0 {
		opt("-m", "multiport", "--dports", joinXTPorts(r.MultiportDPorts))
	}
	if r.DPort.First != 0 {
		opt("-m", "tcp", "--dport", xtPorts(r.DPort))
	}
	// Names never hold quotes or backslashes, so plain quoting matches what iptables-save prints.
	opt("-m", "comment", "--comment", "\""+r.Comment+"\"", "-j", r.Target)
	if r.Target == TargetRedirect {
		opt("--to-ports", strconv.Itoa(int(r.ToPort)))
	}
	return Rule{Chain: r.Chain, Spec: b.String()}
}

// Targets of our rules other than jumps to our chains.
const (
	TargetReturn   = "RETURN"
	TargetRedirect = "REDIRECT"
)

// XTRules returns the iptables rules inside our two chains for family f, in plan order:
// first PROXY_INIT_REDIRECT, then PROXY_INIT_OUTPUT. Each step becomes one rule, except that an
// ignored port list is split into multiport groups of at most 15 ports, and a subnet list or a
// redirected port list becomes one rule per item.
func (r *Ruleset) XTRules(f Family) []XTRule {
	// Sized up front, for this family's subnets only: with a thousand subnets, a cold process
	// pays for every page it touches.
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
			x := XTRule{Chain: c.Name, Target: TargetReturn}
			switch s.Kind {
			case StepIgnorePorts:
				for _, g := range multiportGroups(s.Ports) {
					x.TCP, x.MultiportDPorts, x.Comment = true, g, s.Comment(joinXTPorts(g))
					out = append(out, x)
				}
			case StepIgnoreSubnets:
				for _, p := range s.Subnets {
					if !f.Contains(p) {
						continue
					}
					y := x
					if s.Source {
						y.Source = p
					} else {
						y.Destination = p
					}
					y.Comment = s.Comment(p.String())
					out = append(out, y)
				}
			case StepIgnoreUID:
				x.UIDOwner, x.Comment = &s.ID, s.Comment("")
				out = append(out, x)
			case StepIgnoreGID:
				x.GIDOwner, x.Comment = &s.ID, s.Comment("")
				out = append(out, x)
			case StepIgnoreInterface:
				x.OutInterface, x.Comment = s.Interface, s.Comment("")
				out = append(out, x)
			case StepRedirect:
				x.TCP, x.Target, x.ToPort = true, TargetRedirect, s.Port
				if len(s.Ports) == 0 {
					x.Comment = s.Comment("")
					out = append(out, x)
				}
				for _, p := range s.Ports {
					y := x
					y.DPort, y.Comment = p, s.Comment(s.PortLabel(p))
					out = append(out, y)
				}
			}
		}
	}
	return out
}

// XTJumps returns the rules that hook our chains into the built-in nat chains. They are the
// same for both families and every configuration.
func XTJumps() []XTRule {
	var out []XTRule
	for _, c := range Chains() {
		out = append(out, XTRule{Chain: c.Hook.Builtin, Comment: CommentPrefix + c.JumpName, Target: c.Name})
	}
	return out
}

// Saved returns what iptables-save shows of ours in family f once rs is applied: our chains, then
// every rule in the order iptables-save lists them: the jumps first (built-in chains are printed
// before ours), then our chains' rules, chains in name order. It is empty for a family rs does not
// write. It is rendered once per family; callers must not modify it.
func (r *Ruleset) Saved(f Family) SavedState {
	if !r.HasFamily(f) {
		return SavedState{}
	}
	c := &r.saved[0]
	if f == IPv6 {
		c = &r.saved[1]
	}
	c.once.Do(func() {
		chain := r.XTRules(f)
		jumps := XTJumps()
		c.s = SavedState{Chains: []string{OutputChain, RedirectChain}, Rules: make([]string, 0, len(chain)+len(jumps))}
		for _, j := range jumps {
			c.s.Rules = append(c.s.Rules, j.Rule().String())
		}
		// iptables-save prints user chains sorted by name: PROXY_INIT_OUTPUT before PROXY_INIT_REDIRECT.
		for _, name := range c.s.Chains {
			for _, rl := range chain {
				if rl.Chain == name {
					c.s.Rules = append(c.s.Rules, rl.Rule().String())
				}
			}
		}
	})
	return c.s
}

// Hash identifies the plan, so a backend can record what it wrote and skip an identical re-run.
// Every rule derives from the Ruleset's fields, so hashing them is enough, and much cheaper than
// rendering a thousand rules in a process that lives for milliseconds. It guards against
// accidents, not adversaries (whoever can write the table can write its comment), so FNV serves;
// a cryptographic hash would add its package initialisation to every run.
func (r *Ruleset) Hash() string {
	h := fnv.New64a()
	fmt.Fprintf(h, "%v|%d|%d|%d|%d|%v|%v|%v|", r.Families, r.InboundProxyPort, r.OutboundProxyPort,
		r.ProxyUID, r.ProxyGID, r.RedirectPorts, r.InboundIgnorePorts, r.OutboundIgnorePorts)
	for _, list := range [][]netip.Prefix{r.InboundIgnoreSubnets, r.OutboundIgnoreSubnets} {
		for _, p := range list {
			h.Write([]byte(p.String() + ","))
		}
		h.Write([]byte("|"))
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// joinXTPorts renders a multiport argument list: "4190,4191,6000:7000".
func joinXTPorts(ports []PortRange) string {
	parts := make([]string, len(ports))
	for i, p := range ports {
		parts[i] = xtPorts(p)
	}
	return strings.Join(parts, ",")
}

// multiportGroups splits ports into multiport argument lists of at most 15 ports, a range
// counting as two.
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
