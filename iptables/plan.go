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
	// Builtin is iptables' built-in chain at this hook (in every table), which jumps to ours.
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

// XTTable is an iptables table our chains live in: where its chains sit among the hooks'
// priorities, and the nftables chain type that does what it does.
type XTTable struct {
	Name string
	// Priority is the table's netfilter priority (NF_IP_PRI_*): the nftables chains that stand
	// for its chains sit there, so every backend sees packets at the same point.
	Priority int
	// ChainType is the nftables base chain type of its chains: nat for nat, filter for the rest.
	ChainType string
}

var (
	// TableNAT holds the redirects: Linkerd's table, and the only one a Linkerd config uses.
	TableNAT = XTTable{Name: Table, Priority: -100, ChainType: "nat"}
	// TableMangle holds TPROXY and the INVALID drop, after conntrack and before nat.
	TableMangle = XTTable{Name: "mangle", Priority: -150, ChainType: "filter"}
	// TableRaw holds the DNS conntrack zones, which must be set before conntrack looks a
	// packet up.
	TableRaw = XTTable{Name: "raw", Priority: -300, ChainType: "filter"}
)

// XTTables lists the tables our chains can live in, in the order every rendering and reading
// puts them.
func XTTables() []XTTable { return []XTTable{TableNAT, TableMangle, TableRaw} }

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
	// StepIgnoreInterface returns traffic leaving through (or, In, arriving on) the interface
	// Interface.
	StepIgnoreInterface
	// StepRedirect redirects TCP (to the destination ports Ports, or to every port when Ports is
	// empty) to the local port Port.
	StepRedirect
	// StepRedirectOutbound redirects outbound TCP to the local port Port, only to the
	// destination ports Ports (when given) and to the destination subnets Subnets (when given):
	// the outbound include lists.
	StepRedirectOutbound
	// StepRedirectDNS redirects DNS over Proto (udp or tcp) to Servers (every nameserver when
	// empty) to the local port Port.
	StepRedirectDNS
	// StepDNSZone puts DNS packets into conntrack zone Zone: UDP from the local port SPort, or
	// UDP to port 53 (to Servers, when given), from sockets of the user or group ID (Owner) or
	// out of the interface Interface, when given.
	StepDNSZone
	// StepDropInvalid drops TCP that conntrack marks INVALID.
	StepDropInvalid
	// StepIgnoreEstablished returns TCP of connections conntrack has seen both ways (or that
	// are related to one): they already have their socket.
	StepIgnoreEstablished
	// StepTPROXY hands TCP (to the destination ports Ports, or every port when empty) to the
	// transparent socket on the local port Port, marking it Mark for the policy route, and
	// drops it when no such socket exists.
	StepTPROXY
)

// Owner says which socket owner a step matches.
type Owner int

const (
	OwnerAny Owner = iota
	OwnerUID
	OwnerGID
)

// DNSPort is where DNS is captured.
const DNSPort = 53

// Conntrack zones of DNS over UDP. Queries the proxy answers and the proxy's answers share one
// zone; queries that go out as they are (the proxy's own, the exempt users', to other
// nameservers) and every nameserver's answer share the other. A UDP query and the proxy's
// forwarded copy can have the same addresses and ports, and one zone would mix their NAT.
const (
	ZoneDirect   uint16 = 1
	ZoneCaptured uint16 = 2
)

// TPROXYMark is the packet mark TPROXY sets and the policy route looks for, and TPROXYTable the
// route table that delivers marked packets locally; TPROXYRulePriority is the ip rule's place.
// They are fixed, so cleanup finds them without a configuration.
const (
	TPROXYMark         uint32 = 0x102f // 4143
	TPROXYTable        uint32 = 4143
	TPROXYRulePriority        = 4143
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
	// In matches Interface as the one a packet arrives on (-i) rather than leaves by (-o). On a
	// step of another kind than StepIgnoreInterface, it limits the step to packets arriving on
	// Interface (a rerouted interface's steps).
	In bool
	// Direction, when set, is the direction whose lists the step holds, if not its chain's: a
	// rerouted interface's steps hold the outbound lists in the inbound chain (nftables shares
	// their sets).
	Direction string
	Port      uint16
	// Proto is udp or tcp (StepRedirectDNS).
	Proto string
	// Servers are addresses of both families (StepRedirectDNS, StepDNSZone).
	Servers []netip.Addr
	// Owner says whether ID is a UID or a GID to match (StepDNSZone).
	Owner Owner
	// SPort, when set, matches UDP from this local port instead of UDP to port 53 (StepDNSZone).
	SPort uint16
	// DNSAnswers matches UDP from port 53: a nameserver's answer (StepDNSZone).
	DNSAnswers bool
	Zone       uint16
	Mark       uint32
}

// IsList reports whether the step covers a list that a backend may split over several rules
// (iptables) or keep in one set (nftables); its rule names then carry the list's items.
func (s Step) IsList() bool {
	switch s.Kind {
	case StepIgnorePorts, StepIgnoreSubnets, StepRedirectOutbound:
		return true
	case StepRedirect, StepTPROXY:
		return len(s.Ports) > 0
	case StepRedirectDNS, StepDNSZone:
		return len(s.Servers) > 0
	}
	return false
}

// Comment is the rule comment for the step, with items (the list items the rule covers, as
// PortLabel and Prefix.String spell them, comma-separated) for a list step.
func (s Step) Comment(items string) string {
	if !s.IsList() {
		return CommentPrefix + s.Name
	}
	return CommentPrefix + s.Name + items + s.NameTail
}

// PortLabel spells a port or range the way the step's rule names do. Lists matched with
// multiport (ignore lists, outbound include lists) use xtables' "a:b", as the multiport argument
// they name; redirect names use "a-b". Both are Linkerd's.
func (s Step) PortLabel(p PortRange) string {
	if s.Kind == StepIgnorePorts || s.Kind == StepRedirectOutbound {
		return xtPorts(p)
	}
	return p.String()
}

// PlanChain is one of our chains: the table and hook it hangs from and its steps in order.
type PlanChain struct {
	Name  string
	Table XTTable
	Hook  Hook
	// JumpName names the rule in the hook's built-in chain that jumps to this chain.
	JumpName string
	// Direction is "inbound" or "outbound" ("dns" for the zones); nftables names the chain's
	// sets after it.
	Direction string
	Steps     []Step
}

// Chains returns every chain of ours, without steps: PROXY_INIT_REDIRECT and PROXY_INIT_OUTPUT
// (nat, Linkerd's), then those of the features beyond Linkerd's. Their names, tables, hooks and
// jumps depend on no configuration, so cleanup needs none.
func Chains() []PlanChain {
	return []PlanChain{
		{Name: RedirectChain, Table: TableNAT, Hook: HookPrerouting, JumpName: "install-proxy-init-prerouting", Direction: "inbound"},
		{Name: OutputChain, Table: TableNAT, Hook: HookOutput, JumpName: "install-proxy-init-output", Direction: "outbound"},
		{Name: MangleChain, Table: TableMangle, Hook: HookPrerouting, JumpName: "install-proxy-init-mangle-prerouting", Direction: "inbound"},
		{Name: RawPreroutingChain, Table: TableRaw, Hook: HookPrerouting, JumpName: "install-proxy-init-raw-prerouting", Direction: "dns"},
		{Name: RawOutputChain, Table: TableRaw, Hook: HookOutput, JumpName: "install-proxy-init-raw-output", Direction: "dns"},
	}
}

// Plan returns our chains (Chains) with their steps in the order the kernel evaluates them (the
// first RETURN, REDIRECT, TPROXY or DROP that matches wins), leaving out the chains beyond
// Linkerd's two that have no steps: a Linkerd configuration has exactly Linkerd's chains.
func (r *Ruleset) Plan() []PlanChain {
	all := Chains()
	in, out, mangle, rawIn, rawOut := &all[0], &all[1], &all[2], &all[3], &all[4]
	if !r.TPROXY {
		in.Steps = append(r.interfaceSteps(true), r.inboundSkipSteps()...)
		in.Steps = append(in.Steps, r.inboundRedirectStep())
	}
	mangle.Steps = r.mangleSteps()
	exempts := r.exemptions()
	out.Steps = r.outboundSteps(exempts)
	if r.DNSPort != 0 {
		rawOut.Steps, rawIn.Steps = r.dnsZoneSteps(exempts)
	}
	r.reroute(in, out.Steps)

	chains := all[:2]
	for _, c := range all[2:] {
		if len(c.Steps) > 0 {
			chains = append(chains, c)
		}
	}
	return chains
}

// interfaceSteps ignore the interfaces to ignore, as the one a packet arrives on (inbound) or
// leaves by.
func (r *Ruleset) interfaceSteps(inbound bool) []Step {
	var steps []Step
	for _, name := range r.IgnoreInterfaces {
		steps = append(steps, Step{Kind: StepIgnoreInterface, Name: "ignore-interface-" + name, Interface: name, In: inbound})
	}
	return steps
}

// inboundSkipSteps ignore the inbound ports and source subnets to ignore.
func (r *Ruleset) inboundSkipSteps() []Step {
	var steps []Step
	if len(r.InboundIgnorePorts) > 0 {
		steps = append(steps, Step{Kind: StepIgnorePorts, Name: "ignore-port-", Ports: r.InboundIgnorePorts})
	}
	if len(r.InboundIgnoreSubnets) > 0 {
		steps = append(steps, Step{Kind: StepIgnoreSubnets, Name: "ignore-subnet-", Subnets: r.InboundIgnoreSubnets, Source: true})
	}
	return steps
}

// inboundRedirectStep redirects inbound TCP, to every port or the ports to redirect, to the
// inbound proxy port.
func (r *Ruleset) inboundRedirectStep() Step {
	if len(r.RedirectPorts) == 0 {
		return Step{Kind: StepRedirect, Name: "redirect-all-incoming-to-proxy-port", Port: r.InboundProxyPort}
	}
	return Step{Kind: StepRedirect, Name: "redirect-port-", NameTail: "-to-proxy-port", Ports: r.RedirectPorts, Port: r.InboundProxyPort}
}

// mangleSteps are the mangle chain's: the INVALID drop, and inbound TPROXY with its skips.
func (r *Ruleset) mangleSteps() []Step {
	var steps []Step
	if r.DropInvalid || r.TPROXY {
		steps = r.interfaceSteps(true)
	}
	if r.DropInvalid {
		steps = append(steps, Step{Kind: StepDropInvalid, Name: "drop-invalid"})
	}
	if !r.TPROXY {
		return steps
	}
	// Connections between the pod's own sockets cross loopback, as with redirect.
	steps = append(steps, Step{Kind: StepIgnoreInterface, Name: "ignore-loopback", Interface: "lo", In: true})
	// A virtual machine's outbound TCP is left to the nat chain, which reroutes it.
	for _, name := range r.RerouteInterfaces {
		steps = append(steps, Step{Kind: StepIgnoreInterface, Name: RerouteInterfacePrefix + name, Interface: name, In: true})
	}
	steps = append(steps, r.inboundSkipSteps()...)
	steps = append(steps, Step{Kind: StepIgnoreEstablished, Name: "ignore-established"})
	tp := Step{Kind: StepTPROXY, Name: "tproxy-all-incoming-to-proxy-port", Port: r.InboundProxyPort, Mark: TPROXYMark}
	if len(r.RedirectPorts) > 0 {
		tp.Name, tp.NameTail, tp.Ports = "tproxy-port-", "-to-proxy-port", r.RedirectPorts
	}
	return append(steps, tp)
}

// exemption is a user or group whose traffic goes out as it is: the proxy's, or one to ignore.
type exemption struct {
	name  string
	owner Owner
	id    uint32
}

func (r *Ruleset) exemptions() []exemption {
	var exempts []exemption
	if r.ProxyUID >= 0 {
		exempts = append(exempts, exemption{"proxy-user-id", OwnerUID, uint32(r.ProxyUID)})
	}
	if r.ProxyGID >= 0 {
		exempts = append(exempts, exemption{"proxy-group-id", OwnerGID, uint32(r.ProxyGID)})
	}
	for _, id := range r.IgnoreUIDs {
		exempts = append(exempts, exemption{"user-id-" + strconv.FormatUint(uint64(id), 10), OwnerUID, id})
	}
	for _, id := range r.IgnoreGIDs {
		exempts = append(exempts, exemption{"group-id-" + strconv.FormatUint(uint64(id), 10), OwnerGID, id})
	}
	return exempts
}

// outboundSteps are the outbound chain's: the exemptions, the ignored interfaces, DNS capture,
// loopback, the ignore lists, then the redirect to the outbound proxy port.
func (r *Ruleset) outboundSteps(exempts []exemption) []Step {
	var steps []Step
	for _, e := range exempts {
		kind := StepIgnoreUID
		if e.owner == OwnerGID {
			kind = StepIgnoreGID
		}
		steps = append(steps, Step{Kind: kind, Name: "ignore-" + e.name, ID: e.id})
	}
	steps = append(steps, r.interfaceSteps(false)...)
	if r.DNSPort != 0 {
		for _, proto := range []string{"udp", "tcp"} {
			dns := Step{Kind: StepRedirectDNS, Name: "redirect-dns-" + proto, Proto: proto, Servers: r.DNSServers, Port: r.DNSPort}
			if len(r.DNSServers) > 0 {
				dns.Name += "-"
			}
			steps = append(steps, dns)
		}
	}
	steps = append(steps, Step{Kind: StepIgnoreInterface, Name: "ignore-loopback", Interface: "lo"})
	if len(r.OutboundIgnorePorts) > 0 {
		steps = append(steps, Step{Kind: StepIgnorePorts, Name: "ignore-port-", Ports: r.OutboundIgnorePorts})
	}
	if len(r.OutboundIgnoreSubnets) > 0 {
		steps = append(steps, Step{Kind: StepIgnoreSubnets, Name: "ignore-subnet-", Subnets: r.OutboundIgnoreSubnets})
	}
	switch {
	case len(r.OutboundRedirectPorts) > 0:
		return append(steps, Step{Kind: StepRedirectOutbound, Name: "redirect-outbound-port-", NameTail: "-to-proxy-port",
			Ports: r.OutboundRedirectPorts, Subnets: r.OutboundRedirectSubnets, Port: r.OutboundProxyPort})
	case len(r.OutboundRedirectSubnets) > 0:
		return append(steps, Step{Kind: StepRedirectOutbound, Name: "redirect-outbound-subnet-", NameTail: "-to-proxy-port",
			Subnets: r.OutboundRedirectSubnets, Port: r.OutboundProxyPort})
	}
	return append(steps, Step{Kind: StepRedirect, Name: "redirect-all-outgoing-to-proxy-port", Port: r.OutboundProxyPort})
}

// dnsZoneSteps are the raw chains' steps (output, prerouting) that put DNS into its conntrack
// zones. The first that matches holds (the zone is set once, before conntrack).
func (r *Ruleset) dnsZoneSteps(exempts []exemption) (output, prerouting []Step) {
	for _, e := range exempts {
		output = append(output, Step{Kind: StepDNSZone, Name: "dns-zone-" + e.name, Owner: e.owner, ID: e.id, Zone: ZoneDirect})
	}
	for _, name := range r.IgnoreInterfaces {
		output = append(output, Step{Kind: StepDNSZone, Name: "dns-zone-interface-" + name, Interface: name, Zone: ZoneDirect})
	}
	output = append(output, Step{Kind: StepDNSZone, Name: "dns-zone-proxy-answers", SPort: r.DNSPort, Zone: ZoneCaptured})
	captured := Step{Kind: StepDNSZone, Name: "dns-zone-captured", Servers: r.DNSServers, Zone: ZoneCaptured}
	if len(r.DNSServers) > 0 {
		captured.Name += "-"
	}
	output = append(output, captured)
	if len(r.DNSServers) > 0 {
		output = append(output, Step{Kind: StepDNSZone, Name: "dns-zone-not-captured", Zone: ZoneDirect})
	}
	prerouting = []Step{{Kind: StepDNSZone, Name: "dns-zone-nameserver-answers", DNSAnswers: true, Zone: ZoneDirect}}
	return output, prerouting
}

// ReroutePrefix starts the names of a rerouted interface's steps: the outbound step's name follows.
const ReroutePrefix = "reroute-"

// reroute puts first in the inbound chain, for each of the virtual machine's interfaces, the
// outbound steps that apply to traffic from outside the pod's sockets (the ignore and include
// lists and the redirect to the outbound port), limited to TCP arriving on the interface: the
// VM's outbound traffic reaches the outbound proxy as the pod's own does, and never the inbound
// steps.
func (r *Ruleset) reroute(in *PlanChain, outbound []Step) {
	var steps []Step
	for _, name := range r.RerouteInterfaces {
		for _, s := range outbound {
			switch s.Kind {
			case StepIgnorePorts, StepIgnoreSubnets, StepRedirect, StepRedirectOutbound:
				s.Name, s.Interface, s.In, s.Direction = ReroutePrefix+s.Name, name, true, "outbound"
				steps = append(steps, s)
			}
		}
	}
	in.Steps = append(steps, in.Steps...)
}

// RerouteInterfacePrefix names the rule that keeps TPROXY from a rerouted interface, before the
// interface's name.
const RerouteInterfacePrefix = "reroute-interface-"

// PolicyRoute is what TPROXY needs beside its rules, per family: an ip rule that looks packets
// marked Mark up in route table Table, where a local default route delivers them to this host.
type PolicyRoute struct {
	Family   Family
	Mark     uint32
	Table    uint32
	Priority int
}

// PolicyRoutes returns the policy routing the plan needs: one per family with TPROXY, none
// without.
func (r *Ruleset) PolicyRoutes() []PolicyRoute {
	if !r.TPROXY {
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
func xtPorts(p PortRange) string {
	if p.First == p.Last {
		return strconv.Itoa(int(p.First))
	}
	return strconv.Itoa(int(p.First)) + ":" + strconv.Itoa(int(p.Last))
}
