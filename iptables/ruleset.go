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
	Table          = "nat"
	RedirectChain  = "PROXY_INIT_REDIRECT"
	OutputChain    = "PROXY_INIT_OUTPUT"
	PreroutingHook = "PREROUTING"
	OutputHook     = "OUTPUT"
	CommentPrefix  = "proxy-init/"
)

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

	// rendered caches Rules per family: apply, compare and payloads all need the same lines,
	// and rendering a thousand rules more than once is a visible part of a one-shot run.
	rendered [2]struct {
		once  sync.Once
		rules []Rule
	}
}

// Build validates c and returns the rules it describes.
func Build(c Config) (*Ruleset, error) {
	return c.plan()
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

// writeTo writes the rule as a restore command (verb "-A " or "-D ") and a newline, without
// building the line as a string first.
func (r Rule) writeTo(b *strings.Builder, verb string) {
	b.WriteString(verb)
	b.WriteString(r.Chain)
	if r.Spec != "" {
		b.WriteByte(' ')
		b.WriteString(r.Spec)
	}
	b.WriteByte('\n')
}

// rule renders one rule. Names never hold quotes or backslashes, so plain quoting matches what
// iptables-save prints.
func rule(chain, matches, name, target string) Rule {
	if matches != "" {
		matches += " "
	}
	return Rule{Chain: chain, Spec: matches + "-m comment --comment \"" + CommentPrefix + name + "\" -j " + target}
}

// ChainRules returns the rules inside our two chains for family f, in order: first
// PROXY_INIT_REDIRECT, then PROXY_INIT_OUTPUT.
func (r *Ruleset) ChainRules(f Family) []Rule {
	// Sized up front: with a thousand subnets, a cold process pays for every page it touches.
	out := make([]Rule, 0, len(r.InboundIgnoreSubnets)+len(r.OutboundIgnoreSubnets)+len(r.RedirectPorts)+16)
	in := RedirectChain
	for _, g := range multiportGroups(r.InboundIgnorePorts) {
		out = append(out, rule(in, "-p tcp -m multiport --dports "+g, "ignore-port-"+g, "RETURN"))
	}
	for _, p := range r.InboundIgnoreSubnets {
		if !f.Contains(p) {
			continue
		}
		s := p.String()
		out = append(out, rule(in, "-s "+s, "ignore-subnet-"+s, "RETURN"))
	}
	toIn := "REDIRECT --to-ports " + strconv.Itoa(int(r.InboundProxyPort))
	if len(r.RedirectPorts) == 0 {
		out = append(out, rule(in, "-p tcp", "redirect-all-incoming-to-proxy-port", toIn))
	}
	for _, p := range r.RedirectPorts {
		out = append(out, rule(in, "-p tcp -m tcp --dport "+xtPorts(p), "redirect-port-"+p.String()+"-to-proxy-port", toIn))
	}

	o := OutputChain
	if r.ProxyUID >= 0 {
		out = append(out, rule(o, "-m owner --uid-owner "+strconv.Itoa(r.ProxyUID), "ignore-proxy-user-id", "RETURN"))
	}
	if r.ProxyGID >= 0 {
		out = append(out, rule(o, "-m owner --gid-owner "+strconv.Itoa(r.ProxyGID), "ignore-proxy-group-id", "RETURN"))
	}
	out = append(out, rule(o, "-o lo", "ignore-loopback", "RETURN"))
	for _, g := range multiportGroups(r.OutboundIgnorePorts) {
		out = append(out, rule(o, "-p tcp -m multiport --dports "+g, "ignore-port-"+g, "RETURN"))
	}
	for _, p := range r.OutboundIgnoreSubnets {
		if !f.Contains(p) {
			continue
		}
		s := p.String()
		out = append(out, rule(o, "-d "+s, "ignore-subnet-"+s, "RETURN"))
	}
	out = append(out, rule(o, "-p tcp", "redirect-all-outgoing-to-proxy-port", "REDIRECT --to-ports "+strconv.Itoa(int(r.OutboundProxyPort))))
	return out
}

// Jumps returns the rules that hook our chains into the built-in nat chains. They are the same for
// both families.
func (r *Ruleset) Jumps() []Rule {
	return []Rule{
		rule(PreroutingHook, "", "install-proxy-init-prerouting", RedirectChain),
		rule(OutputHook, "", "install-proxy-init-output", OutputChain),
	}
}

// Rules returns every rule for family f as iptables-save would list it: jumps first (built-in
// chains are printed before ours), then our chains in name order.
func (r *Ruleset) Rules(f Family) []Rule {
	c := &r.rendered[0]
	if f == IPv6 {
		c = &r.rendered[1]
	}
	c.once.Do(func() { c.rules = r.render(f) })
	return c.rules
}

func (r *Ruleset) render(f Family) []Rule {
	chain := r.ChainRules(f)
	out := append(make([]Rule, 0, len(chain)+2), r.Jumps()...)
	// iptables-save prints user chains sorted by name: PROXY_INIT_OUTPUT before PROXY_INIT_REDIRECT.
	for _, c := range []string{OutputChain, RedirectChain} {
		for _, rl := range chain {
			if rl.Chain == c {
				out = append(out, rl)
			}
		}
	}
	return out
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

// xtPorts renders a range the way xtables matches want it: "80" or "1000:2000".
func xtPorts(p PortRange) string {
	if p.First == p.Last {
		return strconv.Itoa(int(p.First))
	}
	return fmt.Sprintf("%d:%d", p.First, p.Last)
}

// multiportGroups splits ports into multiport argument lists of at most 15 ports, a range counting
// as two.
func multiportGroups(ports []PortRange) []string {
	var groups []string
	var cur []string
	n := 0
	for _, p := range ports {
		cost := 1
		if p.First != p.Last {
			cost = 2
		}
		if n+cost > maxMultiportPorts {
			groups = append(groups, strings.Join(cur, ","))
			cur, n = nil, 0
		}
		cur = append(cur, xtPorts(p))
		n += cost
	}
	if len(cur) > 0 {
		groups = append(groups, strings.Join(cur, ","))
	}
	return groups
}
