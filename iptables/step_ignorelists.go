package iptables

// The ignore lists: TCP to the ports, and traffic from (inbound) or to the subnets, skip the proxy.

import "net/netip"

// ignoreListSteps are the steps of one direction's ignore lists, matching the subnets as the
// source (inbound) or the destination.
func ignoreListSteps(ports []PortRange, subnets []netip.Prefix, source bool) []Step {
	var steps []Step
	if len(ports) > 0 {
		steps = append(steps, ignorePortsStep{StepCommon{Name: "ignore-port-"}, ports})
	}
	if len(subnets) > 0 {
		steps = append(steps, ignoreSubnetsStep{StepCommon{Name: "ignore-subnet-"}, subnets, source})
	}
	return steps
}

// ignorePortsStep returns TCP to the destination ports Ports.
type ignorePortsStep struct {
	StepCommon
	Ports []PortRange
}

func (s ignorePortsStep) rerouted(iface string) Step { return reroutedStep(s, iface) }

func (s ignorePortsStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	for _, g := range multiportGroups(s.Ports) {
		x.TCP, x.MultiportDPorts, x.Comment = true, g, comment(s, joinXTPorts(g))
		out = append(out, x)
	}
	return out
}

func (s ignorePortsStep) nftRules(w *nftWriter) {
	set := w.addSet(w.dir+"_ignore_ports", NFTPorts, portIntervals(s.Ports))
	w.add(NFTRule{Comment: portsComment(s.StepCommon, s.Ports, xtPorts), Matches: []NFTMatch{{Kind: NFTMatchDPortSet, Set: set}}})
}

// ignoreSubnetsStep returns traffic from (Source) or to the subnets Subnets, of both families.
type ignoreSubnetsStep struct {
	StepCommon
	Subnets []netip.Prefix
	Source  bool
}

func (s ignoreSubnetsStep) rerouted(iface string) Step { return reroutedStep(s, iface) }

// xtRules: one rule per subnet of family f.
func (s ignoreSubnetsStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	return appendPer(out, x, s, s.Subnets, func(y XTRule, p netip.Prefix) (XTRule, bool) {
		if s.Source {
			y.Source = p
		} else {
			y.Destination = p
		}
		return y, f.Contains(p)
	})
}

// nftRules: one rule per family with subnets in the list, matching the family's set of them.
func (s ignoreSubnetsStep) nftRules(w *nftWriter) {
	kind := NFTMatchDAddrSet
	if s.Source {
		kind = NFTMatchSAddrSet
	}
	w.perFamily(w.dir+"_ignore_subnets", s.Subnets, func(f Family, set string, ps []netip.Prefix) {
		w.add(NFTRule{
			Comment: listComment(s.StepCommon, len(ps), func(i int) string { return ps[i].String() }),
			Matches: []NFTMatch{{Kind: kind, Family: f, Set: set}},
		})
	})
}
