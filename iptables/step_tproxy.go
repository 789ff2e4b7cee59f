package iptables

// TPROXY: inbound TCP is handed to the proxy's transparent socket in the mangle table, without
// NAT, after skipping loopback, the virtual machine's interfaces, the inbound ignore lists and
// established connections; a policy route delivers the marked packets locally.

import "net/netip"

// TPROXYMark is the packet mark TPROXY sets and the policy route looks for, and TPROXYTable the
// route table that delivers marked packets locally; TPROXYRulePriority is the ip rule's place.
// They are fixed, so cleanup finds them without a configuration.
const (
	TPROXYMark         uint32 = 0x102f // 4143
	TPROXYTable        uint32 = 4143
	TPROXYRulePriority        = 4143
)

// NFTTPROXYDropName names the rule after a TPROXY rule, which drops what no transparent socket
// took: iptables' TPROXY target drops it itself.
const NFTTPROXYDropName = "drop-tproxy-without-listener"

// tproxySteps are the mangle chain's steps for TPROXY.
func (r *Ruleset) tproxySteps() []Step {
	// Connections between the pod's own sockets cross loopback, as with redirect.
	steps := []Step{ignoreLoopback(true)}
	// A virtual machine's outbound TCP is left to the nat chain, which reroutes it.
	for _, name := range r.RerouteInterfaces {
		steps = append(steps, ignoreInterfaceStep{StepCommon{Name: RerouteInterfacePrefix + name}, name, true})
	}
	steps = append(steps, ignoreListSteps(r.InboundIgnorePorts, r.InboundIgnoreSubnets, true)...)
	steps = append(steps, ignoreEstablishedStep{StepCommon{Name: "ignore-established"}})
	tp := tproxyStep{StepCommon{Name: "tproxy-all-incoming-to-proxy-port"}, nil, r.InboundProxyPort, TPROXYMark}
	if len(r.RedirectPorts) > 0 {
		tp.Name, tp.NameTail, tp.Ports = "tproxy-port-", "-to-proxy-port", r.RedirectPorts
	}
	return append(steps, tp)
}

// ignoreEstablishedStep returns TCP of connections conntrack has seen both ways (or that are
// related to one): they already have their socket.
type ignoreEstablishedStep struct{ StepCommon }

func (s ignoreEstablishedStep) IsList() bool { return false }

func (s ignoreEstablishedStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.TCP, x.CTState, x.Comment = true, CTStateEstablished, comment(s, "")
	return append(out, x)
}

func (s ignoreEstablishedStep) nftRules(w *nftWriter, cw *nftChainWriter, dir string) {
	cw.add(NFTRule{Comment: comment(s, ""), Matches: []NFTMatch{{Kind: NFTMatchTCP}, {Kind: NFTMatchCTState, ID: NFTCTEstablished | NFTCTRelated}}})
}

// tproxyStep hands TCP (to the destination ports Ports, or every port when empty) to the
// transparent socket on the local port Port, marking it Mark for the policy route, and drops it
// when no such socket exists.
type tproxyStep struct {
	StepCommon
	Ports []PortRange
	Port  uint16
	Mark  uint32
}

func (s tproxyStep) IsList() bool { return len(s.Ports) > 0 }

func (s tproxyStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.TCP, x.Target, x.ToPort, x.Mark = true, TargetTPROXY, s.Port, s.Mark
	x.OnIP = netip.IPv4Unspecified()
	if f == IPv6 {
		x.OnIP = netip.IPv6Unspecified()
	}
	return appendPerPort(out, x, s, s.Ports)
}

// nftRules: the TPROXY rule, then one that drops what it matches (what no transparent socket
// took).
func (s tproxyStep) nftRules(w *nftWriter, cw *nftChainWriter, dir string) {
	rl := NFTRule{Comment: comment(s, ""), Verdict: NFTTPROXY, RedirectPort: s.Port, Mark: s.Mark}
	if len(w.only4) > 0 {
		rl.TPROXYFamily = IPv4 // nft takes a family-less tproxy only where both pass
	}
	rl.Matches = w.acting(w.redirectPorts(dir, s.StepCommon, s.Ports, PortRange.String, &rl))
	cw.add(rl)
	cw.add(NFTRule{Comment: CommentPrefix + NFTTPROXYDropName, Matches: rl.Matches, Verdict: NFTDrop})
}
