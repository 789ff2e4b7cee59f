package iptables

// The plan: what our rules do, written once, in the order a packet meets them, and in no
// backend's syntax. The iptables rendering (XTRules) and the nftables rendering (NFT) only spell
// these steps; neither decides what exists, which names the rules carry, or which hook a chain
// hangs from. A new backend renders the same steps.

import (
	"fmt"
	"net/netip"
	"strconv"
)

// Hook is a netfilter hook one of our chains is attached to, under each backend's name for it.
type Hook struct {
	// Number is the kernel's hook number (NF_INET_PRE_ROUTING, NF_INET_LOCAL_OUT).
	Number uint32
	// Builtin is iptables' built-in nat chain at this hook, which jumps to ours.
	Builtin string
	// NFT is nft's name for the hook.
	NFT string
}

var (
	// HookPrerouting sees inbound packets before routing.
	HookPrerouting = Hook{Number: 0, Builtin: "PREROUTING", NFT: "prerouting"}
	// HookOutput sees locally generated packets.
	HookOutput = Hook{Number: 3, Builtin: "OUTPUT", NFT: "output"}
)

// HookByNumber returns the hook the kernel numbers n; a hook we never use gets a name that
// shows its number, so a foreign chain read back still reads as what it is.
func HookByNumber(n uint32) Hook {
	for _, h := range []Hook{HookPrerouting, HookOutput} {
		if h.Number == n {
			return h
		}
	}
	return Hook{Number: n, Builtin: fmt.Sprintf("HOOK-%d", n), NFT: fmt.Sprintf("hook-%d", n)}
}

// StepKind is what one step of the plan decides.
type StepKind int

const (
	// StepIgnorePorts returns TCP to the destination ports Ports: they skip the proxy.
	StepIgnorePorts StepKind = iota + 1
	// StepIgnoreSubnets returns traffic from (Source) or to the subnets Subnets.
	StepIgnoreSubnets
	// StepIgnoreUID returns traffic of sockets owned by the user ID.
	StepIgnoreUID
	// StepIgnoreGID returns traffic of sockets owned by the group ID.
	StepIgnoreGID
	// StepIgnoreInterface returns traffic leaving through the interface Interface.
	StepIgnoreInterface
	// StepRedirect redirects TCP (to the destination ports Ports, or to every port when Ports is
	// empty) to the local port Port.
	StepRedirect
)

// Step is one decision of the plan. Which fields are used depends on Kind.
type Step struct {
	Kind StepKind
	// Name is the rule name: the whole of it for a single rule; for a step over a list, the part
	// before the list's items, and NameTail the part after ("redirect-port-" ... "-to-proxy-port").
	Name, NameTail string
	Ports          []PortRange
	// Subnets holds both families; each family's rules take their own (Subnets function).
	Subnets []netip.Prefix
	// Source is set when Subnets match the source address rather than the destination.
	Source    bool
	ID        uint32
	Interface string
	Port      uint16
}

// IsList reports whether the step covers a list that a backend may split over several rules
// (iptables) or keep in one set (nftables); its rule names then carry the list's items.
func (s Step) IsList() bool {
	return s.Kind == StepIgnorePorts || s.Kind == StepIgnoreSubnets || s.Kind == StepRedirect && len(s.Ports) > 0
}

// Comment is the rule comment for the step, with items (the list items the rule covers, as
// PortLabel and Prefix.String spell them, comma-separated) for a list step.
func (s Step) Comment(items string) string {
	if !s.IsList() {
		return CommentPrefix + s.Name
	}
	return CommentPrefix + s.Name + items + s.NameTail
}

// PortLabel spells a port or range the way the step's rule names do. Ignore lists use xtables'
// "a:b", as the multiport argument they name; redirect names use "a-b". Both are Linkerd's.
func (s Step) PortLabel(p PortRange) string {
	if s.Kind == StepIgnorePorts {
		return xtPorts(p)
	}
	return p.String()
}

// PlanChain is one of our chains: the hook it hangs from and its steps in order.
type PlanChain struct {
	Name string
	Hook Hook
	// JumpName names the rule in the hook's built-in chain that jumps to this chain.
	JumpName string
	// Direction is "inbound" or "outbound"; nftables names the chain's sets after it.
	Direction string
	Steps     []Step
}

// Chains returns our two chains, PROXY_INIT_REDIRECT then PROXY_INIT_OUTPUT, without steps:
// their names, hooks and jumps depend on no configuration, so cleanup needs none.
func Chains() []PlanChain {
	return []PlanChain{
		{Name: RedirectChain, Hook: HookPrerouting, JumpName: "install-proxy-init-prerouting", Direction: "inbound"},
		{Name: OutputChain, Hook: HookOutput, JumpName: "install-proxy-init-output", Direction: "outbound"},
	}
}

// Plan returns our two chains (Chains) with their steps in the order the kernel evaluates them:
// the first RETURN or REDIRECT that matches wins.
func (r *Ruleset) Plan() []PlanChain {
	chains := Chains()
	in, out := &chains[0], &chains[1]
	if len(r.InboundIgnorePorts) > 0 {
		in.Steps = append(in.Steps, Step{Kind: StepIgnorePorts, Name: "ignore-port-", Ports: r.InboundIgnorePorts})
	}
	if len(r.InboundIgnoreSubnets) > 0 {
		in.Steps = append(in.Steps, Step{Kind: StepIgnoreSubnets, Name: "ignore-subnet-", Subnets: r.InboundIgnoreSubnets, Source: true})
	}
	if len(r.RedirectPorts) == 0 {
		in.Steps = append(in.Steps, Step{Kind: StepRedirect, Name: "redirect-all-incoming-to-proxy-port", Port: r.InboundProxyPort})
	} else {
		in.Steps = append(in.Steps, Step{Kind: StepRedirect, Name: "redirect-port-", NameTail: "-to-proxy-port", Ports: r.RedirectPorts, Port: r.InboundProxyPort})
	}

	if r.ProxyUID >= 0 {
		out.Steps = append(out.Steps, Step{Kind: StepIgnoreUID, Name: "ignore-proxy-user-id", ID: uint32(r.ProxyUID)})
	}
	if r.ProxyGID >= 0 {
		out.Steps = append(out.Steps, Step{Kind: StepIgnoreGID, Name: "ignore-proxy-group-id", ID: uint32(r.ProxyGID)})
	}
	out.Steps = append(out.Steps, Step{Kind: StepIgnoreInterface, Name: "ignore-loopback", Interface: "lo"})
	if len(r.OutboundIgnorePorts) > 0 {
		out.Steps = append(out.Steps, Step{Kind: StepIgnorePorts, Name: "ignore-port-", Ports: r.OutboundIgnorePorts})
	}
	if len(r.OutboundIgnoreSubnets) > 0 {
		out.Steps = append(out.Steps, Step{Kind: StepIgnoreSubnets, Name: "ignore-subnet-", Subnets: r.OutboundIgnoreSubnets})
	}
	out.Steps = append(out.Steps, Step{Kind: StepRedirect, Name: "redirect-all-outgoing-to-proxy-port", Port: r.OutboundProxyPort})
	return chains
}

// xtPorts renders a range the way xtables matches want it: "80" or "1000:2000".
func xtPorts(p PortRange) string {
	if p.First == p.Last {
		return strconv.Itoa(int(p.First))
	}
	return strconv.Itoa(int(p.First)) + ":" + strconv.Itoa(int(p.Last))
}
