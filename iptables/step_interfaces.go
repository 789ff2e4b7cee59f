package iptables

// Interfaces: traffic by an interface to ignore, and loopback, skips the proxy.

// interfaceSteps ignore the interfaces a packet arrives on (inbound) or leaves by.
func (r *Ruleset) interfaceSteps(inbound bool) []Step {
	var steps []Step
	for _, name := range r.IgnoreInterfaces {
		steps = append(steps, ignoreInterfaceStep{StepCommon{Name: "ignore-interface-" + name}, name, inbound})
	}
	return steps
}

// ignoreLoopback ignores loopback: connections between the pod's own sockets.
func ignoreLoopback(in bool) Step {
	return ignoreInterfaceStep{StepCommon{Name: "ignore-loopback"}, "lo", in}
}

// ignoreInterfaceStep returns traffic leaving through (or, In, arriving on) Interface.
type ignoreInterfaceStep struct {
	StepCommon
	Interface string
	In        bool
}

func (s ignoreInterfaceStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	if s.In {
		x.InInterface = s.Interface
	} else {
		x.OutInterface = s.Interface
	}
	x.Comment = comment(s, "")
	return append(out, x)
}

func (s ignoreInterfaceStep) nftRules(w *nftWriter) {
	kind := NFTMatchOIFName
	if s.In {
		kind = NFTMatchIIFName
	}
	w.add(NFTRule{Comment: comment(s, ""), Matches: []NFTMatch{{Kind: kind, Name: s.Interface}}})
}
