package iptables

// The steps of the plan: one type per kind of decision, each in its feature's file with its
// constructor and both renderings (docs/rule-features.md).

import "fmt"

// Step is one decision of the plan: one feature's rule, or its rules over a list.
type Step interface {
	// Common returns what every step has: its name, and where it is limited to.
	Common() StepCommon
	// xtRules appends the step's iptables rules for family f: x (chain, arriving interface,
	// RETURN) with what the step adds.
	xtRules(out []XTRule, x XTRule, f Family) []XTRule
	// nftRules adds the step's nftables rules to w's chain.
	nftRules(w *nftWriter)
}

// StepCommon is what every step has.
type StepCommon struct {
	// Name is the rule name: the whole of it for a single rule; for a step over a list, the part
	// before the list's items, and NameTail the part after ("redirect-port-" ... "-to-proxy-port").
	Name, NameTail string
	// Arriving, when set, limits the step to packets arriving on this interface, and Direction
	// is whose lists it holds, if not its chain's: a rerouted interface's steps.
	Arriving, Direction string
}

// Common returns c; every step embeds a StepCommon.
func (c StepCommon) Common() StepCommon { return c }

// comment is the rule comment for step s, with items (comma-separated) for a step over a list. It
// is generic so that a step calling it per item (a thousand subnets) is not boxed each time.
func comment[S Step](s S, items string) string {
	c := s.Common()
	return CommentPrefix + c.Name + items + c.NameTail
}

// appendPer appends x once, named after s, or with a list once per item that set takes, as set
// fills it in, named after it. (Generic, and given a copy, so that neither s nor a rule is boxed.)
func appendPer[S Step, T fmt.Stringer](out []XTRule, x XTRule, s S, list []T,
	set func(XTRule, T) (XTRule, bool)) []XTRule {
	if len(list) == 0 {
		x.Comment = comment(s, "")
		return append(out, x)
	}
	for _, v := range list {
		if y, ok := set(x, v); ok {
			y.Comment = comment(s, v.String())
			out = append(out, y)
		}
	}
	return out
}

// portsComment names a rule over the whole of ports, each spelled by label: xtPorts ("a:b") or
// PortRange.String ("a-b"), as Linkerd does.
func portsComment(c StepCommon, ports []PortRange, label func(PortRange) string) string {
	return listComment(c, len(ports), func(i int) string { return label(ports[i]) })
}
