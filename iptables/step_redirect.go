package iptables

// Redirect: inbound TCP (to every port, or the ports to redirect) goes to the inbound proxy port;
// outbound TCP, unless include lists limit it (step_includelists.go), to the outbound one.

// inboundRedirect redirects inbound TCP, to every port or those listed, to the proxy.
func (r *Ruleset) inboundRedirect() Step {
	if len(r.RedirectPorts) == 0 {
		return redirectStep{StepCommon{Name: "redirect-all-incoming-to-proxy-port"}, nil, r.InboundProxyPort}
	}
	return redirectStep{StepCommon{Name: "redirect-port-", NameTail: "-to-proxy-port"}, r.RedirectPorts, r.InboundProxyPort}
}

// redirectStep redirects TCP (to Ports, or every port when empty) to the local port Port.
type redirectStep struct {
	StepCommon
	Ports []PortRange
	Port  uint16
}

func (s redirectStep) rerouted(iface string) Step { return reroutedStep(s, iface) }

func (s redirectStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.TCP, x.Target, x.ToPort = true, TargetRedirect, s.Port
	return appendPer(out, x, s, s.Ports, setDPort)
}

func (s redirectStep) nftRules(w *nftWriter) {
	rl := NFTRule{Comment: comment(s, ""), Verdict: NFTRedirect, RedirectPort: s.Port}
	rl.Matches = w.acting(w.redirectPorts(s.StepCommon, s.Ports, PortRange.String, &rl))
	w.add(rl)
}

// setDPort is appendPer's setter of a redirect's destination ports.
func setDPort(y XTRule, p PortRange) (XTRule, bool) {
	y.DPort = p
	return y, true
}

// redirectPorts is the port match of a redirecting step: any TCP port, or the direction's set of
// those listed, whose list (each spelled by label) then names rl.
func (w *nftWriter) redirectPorts(c StepCommon, ports []PortRange, label func(PortRange) string, rl *NFTRule) NFTMatch {
	if len(ports) == 0 {
		return NFTMatch{Kind: NFTMatchTCP}
	}
	rl.Comment = portsComment(c, ports, label)
	return NFTMatch{Kind: NFTMatchDPortSet, Set: w.addSet(w.dir+"_redirect_ports", NFTPorts, portIntervals(ports))}
}
