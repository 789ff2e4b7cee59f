package iptables

// The plan: what our rules do, in the order a packet meets them and in no backend's syntax. Plan
// puts each feature's steps (step_<feature>.go) into their chains; each step renders itself for
// iptables (XTRules) and nftables (NFT), which decide nothing.

import (
	"fmt"
	"slices"
	"strings"
)

// Hook is a netfilter hook one of our chains is attached to, under each backend's name for it.
type Hook struct {
	// Number is the kernel's hook number (NF_INET_PRE_ROUTING, NF_INET_LOCAL_OUT).
	Number uint32
	// Builtin is iptables' built-in chain at this hook (in every table), which jumps to ours.
	Builtin string
	// NFT is nft's name for the hook.
	NFT string
}

var (
	HookPrerouting = Hook{Number: 0, Builtin: "PREROUTING", NFT: "prerouting"} // inbound, before routing
	HookOutput     = Hook{Number: 3, Builtin: "OUTPUT", NFT: "output"}         // locally generated
)

// HookByNumber returns the hook the kernel numbers n; another hook is named by its number.
func HookByNumber(n uint32) Hook {
	for _, h := range []Hook{HookPrerouting, HookOutput} {
		if h.Number == n {
			return h
		}
	}
	return Hook{Number: n, Builtin: fmt.Sprintf("HOOK-%d", n), NFT: fmt.Sprintf("hook-%d", n)}
}

// XTTable is an iptables table our chains live in.
type XTTable struct {
	Name string
	// Priority is the table's netfilter priority (NF_IP_PRI_*), where the nftables chains that
	// stand for its chains sit, so every backend sees packets at the same point.
	Priority int
	// ChainType is the nftables base chain type of its chains: nat for nat, filter for the rest.
	ChainType string
}

var (
	// TableNAT holds the redirects: Linkerd's table, and the only one a Linkerd config uses.
	TableNAT = XTTable{Name: Table, Priority: -100, ChainType: "nat"}
	// TableMangle holds TPROXY and the INVALID drop, after conntrack and before nat.
	TableMangle = XTTable{Name: "mangle", Priority: -150, ChainType: "filter"}
	// TableRaw holds the DNS conntrack zones, which must be set before conntrack's lookup.
	TableRaw = XTTable{Name: "raw", Priority: -300, ChainType: "filter"}
)

// XTTables lists the tables our chains can live in, in the order every rendering puts them.
func XTTables() []XTTable { return []XTTable{TableNAT, TableMangle, TableRaw} }

// PlanChain is one of our chains: the table and hook it hangs from and its steps in order.
type PlanChain struct {
	Name  string
	Table XTTable
	Hook  Hook
	// JumpName names the rule in the hook's built-in chain that jumps to this chain.
	JumpName string
	// Direction is "inbound", "outbound" or "dns": nftables names the chain's sets after it.
	Direction string
	Steps     []Step
}

// Chains returns every chain of ours, without steps: Linkerd's two, then those of the features
// beyond Linkerd's. They depend on no configuration, so cleanup needs none.
func Chains() []PlanChain { return slices.Clone(ourChains) }

var ourChains = []PlanChain{
	{Name: RedirectChain, Table: TableNAT, Hook: HookPrerouting, JumpName: "install-proxy-init-prerouting", Direction: "inbound"},
	{Name: OutputChain, Table: TableNAT, Hook: HookOutput, JumpName: "install-proxy-init-output", Direction: "outbound"},
	{Name: MangleChain, Table: TableMangle, Hook: HookPrerouting, JumpName: "install-proxy-init-mangle-prerouting", Direction: "inbound"},
	{Name: RawPreroutingChain, Table: TableRaw, Hook: HookPrerouting, JumpName: "install-proxy-init-raw-prerouting", Direction: "dns"},
	{Name: RawOutputChain, Table: TableRaw, Hook: HookOutput, JumpName: "install-proxy-init-raw-output", Direction: "dns"},
}

// Plan returns our chains with their steps in the order the kernel evaluates them (the first
// verdict that matches wins), leaving out those beyond Linkerd's two that have no steps.
func (r *Ruleset) Plan() []PlanChain {
	all := Chains()
	in, out, mangle, rawIn, rawOut := &all[0], &all[1], &all[2], &all[3], &all[4]
	// The mangle chain's: the INVALID drop, and TPROXY with its skips, in place of the nat chain's.
	if r.DropInvalid || r.TPROXY {
		mangle.Steps = r.interfaceSteps(true)
	}
	if r.DropInvalid {
		mangle.Steps = append(mangle.Steps, dropInvalid())
	}
	if r.TPROXY {
		mangle.Steps = append(mangle.Steps, r.tproxySteps()...)
	} else {
		in.Steps = append(r.interfaceSteps(true), ignoreListSteps(r.InboundIgnorePorts, r.InboundIgnoreSubnets, true)...)
		in.Steps = append(in.Steps, r.inboundRedirect())
	}
	exempts := r.exemptions()
	out.Steps = r.outboundSteps(exempts)
	if r.DNSPort != 0 {
		rawOut.Steps, rawIn.Steps = r.dnsZoneSteps(exempts)
	}
	r.reroute(in, out.Steps)
	// Linkerd's two chains always, the others only with steps.
	return append(all[:2:2], slices.DeleteFunc(all[2:], func(c PlanChain) bool {
		return len(c.Steps) == 0
	})...)
}

// outboundSteps are the outbound chain's: the exemptions, the ignored interfaces, DNS capture,
// loopback, the ignore lists, then the redirect to the outbound proxy port.
func (r *Ruleset) outboundSteps(exempts []exemption) []Step {
	steps := ownerSteps(exempts)
	steps = append(steps, r.interfaceSteps(false)...)
	if r.DNSPort != 0 {
		steps = append(steps, r.dnsRedirectSteps()...)
	}
	steps = append(steps, ignoreLoopback(false))
	steps = append(steps, ignoreListSteps(r.OutboundIgnorePorts, r.OutboundIgnoreSubnets, false)...)
	return append(steps, r.outboundRedirect())
}

// PolicyRoute is what TPROXY needs beside its rules, per family: an ip rule that looks packets
// marked Mark up in route table Table, where a local default route delivers them to this host.
type PolicyRoute struct {
	Family   Family
	Mark     uint32
	Table    uint32
	Priority int
}

// PolicyRoutes returns the policy routing the plan needs: one per family with TPROXY (none for a
// nil plan).
func (r *Ruleset) PolicyRoutes() []PolicyRoute {
	if r == nil || !r.TPROXY {
		return nil
	}
	var out []PolicyRoute
	for _, f := range r.Families {
		out = append(out, PolicyRoute{Family: f, Mark: TPROXYMark, Table: TPROXYTable, Priority: TPROXYRulePriority})
	}
	return out
}

// Lines renders the policy route as ip(8) shows it: its rule, then its route.
func (p PolicyRoute) Lines() []string {
	v, dst := "-4", "0.0.0.0/0"
	if p.Family == IPv6 {
		v, dst = "-6", "::/0"
	}
	return []string{
		fmt.Sprintf("ip %s rule: priority %d fwmark %#x lookup %d", v, p.Priority, p.Mark, p.Table),
		fmt.Sprintf("ip %s route: local %s dev lo table %d", v, dst, p.Table),
	}
}

// xtPorts renders a range the way xtables matches want it: "80" or "1000:2000".
func xtPorts(p PortRange) string { return strings.Replace(p.String(), "-", ":", 1) }
