package iptables

// Include lists: outbound TCP goes to the outbound proxy port only to the ports and subnets to
// redirect, when given; otherwise all of it does (step_redirect.go).

import "net/netip"

// outboundRedirect redirects outbound TCP, to the include lists or everywhere, to the proxy.
func (r *Ruleset) outboundRedirect() Step {
	switch {
	case len(r.OutboundRedirectPorts) > 0:
		return redirectOutboundStep{StepCommon{Name: "redirect-outbound-port-", NameTail: "-to-proxy-port"},
			r.OutboundRedirectPorts, r.OutboundRedirectSubnets, r.OutboundProxyPort}
	case len(r.OutboundRedirectSubnets) > 0:
		return redirectOutboundStep{StepCommon{Name: "redirect-outbound-subnet-", NameTail: "-to-proxy-port"},
			nil, r.OutboundRedirectSubnets, r.OutboundProxyPort}
	}
	return redirectStep{StepCommon{Name: "redirect-all-outgoing-to-proxy-port"}, nil, r.OutboundProxyPort}
}

// redirectOutboundStep redirects outbound TCP to the local port Port, to Ports and Subnets if given.
type redirectOutboundStep struct {
	StepCommon
	Ports   []PortRange
	Subnets []netip.Prefix
	Port    uint16
}

func (s redirectOutboundStep) rerouted(iface string) Step { return reroutedStep(s, iface) }

// xtRules: one rule per pair of the subnets of family f and multiport groups of the ports; an
// empty list counts as one item matching everything.
func (s redirectOutboundStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.TCP, x.Target, x.ToPort = true, TargetRedirect, s.Port
	groups := multiportGroups(s.Ports)
	if len(groups) == 0 {
		groups = [][]PortRange{nil}
	}
	subnets := []netip.Prefix{{}}
	if len(s.Subnets) > 0 {
		subnets = Subnets(f, s.Subnets)
	}
	for _, p := range subnets {
		for _, g := range groups {
			y := x
			y.Destination, y.MultiportDPorts = p, g
			if len(g) > 0 {
				y.Comment = comment(s, joinXTPorts(g))
			} else {
				y.Comment = comment(s, p.String())
			}
			out = append(out, y)
		}
	}
	return out
}

// nftRules: one rule, or with subnets one per family to the family's set of them.
func (s redirectOutboundStep) nftRules(w *nftWriter) {
	rl := NFTRule{Comment: comment(s, ""), Verdict: NFTRedirect, RedirectPort: s.Port}
	ports := w.redirectPorts(s.StepCommon, s.Ports, xtPorts, &rl)
	if len(s.Subnets) == 0 {
		rl.Matches = w.acting(ports)
		w.add(rl)
		return
	}
	w.perFamily(w.dir+"_redirect_subnets", s.Subnets, func(f Family, set string, ps []netip.Prefix) {
		x := rl
		x.Matches = []NFTMatch{{Kind: NFTMatchDAddrSet, Family: f, Set: set}, ports}
		if len(s.Ports) == 0 {
			x.Comment = listComment(s.StepCommon, len(ps), func(i int) string { return ps[i].String() })
		}
		w.add(x)
	})
}
