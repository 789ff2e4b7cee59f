package iptables

// TPROXY: inbound TCP goes to the proxy's transparent socket in the mangle table, without NAT,
// past the skips; a policy route delivers the marked packets locally.

import "net/netip"

// TPROXYMark is the mark TPROXY sets, which the ip rule at TPROXYRulePriority sends to route
// table TPROXYTable for local delivery; fixed, so cleanup finds them without a configuration.
const (
	TPROXYMark         uint32 = 0x102f // 4143
	TPROXYTable        uint32 = 4143
	TPROXYRulePriority        = 4143
)

// NFTTPROXYDropName names the rule dropping what no socket took (iptables' TPROXY drops it itself).
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
	tp := tproxyStep{StepCommon{Name: "tproxy-all-incoming-to-proxy-port"}, nil, r.InboundProxyPort}
	if len(r.RedirectPorts) > 0 {
		tp.Name, tp.NameTail, tp.Ports = "tproxy-port-", "-to-proxy-port", r.RedirectPorts
	}
	return append(steps, tp)
}

// ignoreEstablishedStep returns TCP of established or related connections: they have a socket.
type ignoreEstablishedStep struct{ StepCommon }

func (s ignoreEstablishedStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.TCP, x.CTState, x.Comment = true, CTStateEstablished, comment(s, "")
	return append(out, x)
}

func (s ignoreEstablishedStep) nftRules(w *nftWriter) {
	w.add(NFTRule{Comment: comment(s, ""), Matches: []NFTMatch{{Kind: NFTMatchTCP}, {Kind: NFTMatchCTState, ID: NFTCTEstablished | NFTCTRelated}}})
}

// tproxyStep hands TCP (to Ports, or every port) to the transparent socket on the local port
// Port, marking it TPROXYMark for the policy route, and drops it when no such socket exists.
type tproxyStep struct {
	StepCommon
	Ports []PortRange
	Port  uint16
}

func (s tproxyStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.TCP, x.Target, x.ToPort, x.Mark = true, TargetTPROXY, s.Port, TPROXYMark
	x.OnIP = netip.IPv4Unspecified()
	if f == IPv6 {
		x.OnIP = netip.IPv6Unspecified()
	}
	return appendPer(out, x, s, s.Ports, setDPort)
}

// nftRules: the TPROXY rule, then one that drops what no transparent socket took.
func (s tproxyStep) nftRules(w *nftWriter) {
	rl := NFTRule{Comment: comment(s, ""), Verdict: NFTTPROXY, RedirectPort: s.Port, Mark: TPROXYMark}
	if len(w.only4) > 0 {
		rl.TPROXYFamily = IPv4 // nft takes a family-less tproxy only where both pass
	}
	rl.Matches = w.acting(w.redirectPorts(s.StepCommon, s.Ports, PortRange.String, &rl))
	w.add(rl)
	w.add(NFTRule{Comment: CommentPrefix + NFTTPROXYDropName, Matches: rl.Matches, Verdict: NFTDrop})
}
