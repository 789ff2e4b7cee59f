package iptables

// The steps of the plan: one type per kind of decision, each in the file of its feature with
// its constructor, its iptables rendering (xtRules) and its nftables rendering (nftRules).
// XTRules and NFT only loop over the steps; see docs/rule-features.md for adding a feature.

// Step is one decision of the plan: one feature's rule, or its rules over a list.
type Step interface {
	// Common returns what every step has: its name, and where it is limited to.
	Common() StepCommon
	// IsList reports whether the step covers a list that a backend may split over several
	// rules (iptables) or keep in one set (nftables); its rule names then carry the list's items.
	IsList() bool
	// xtRules appends the step's iptables rules for family f, each x (the chain, the arriving
	// interface, RETURN) with what the step adds.
	xtRules(out []XTRule, x XTRule, f Family) []XTRule
	// nftRules adds the step's nftables rules to cw; dir names the sets of its lists.
	nftRules(w *nftWriter, cw *nftChainWriter, dir string)
}

// StepCommon is what every step has.
type StepCommon struct {
	// Name is the rule name: the whole of it for a single rule; for a step over a list, the part
	// before the list's items, and NameTail the part after ("redirect-port-" ... "-to-proxy-port").
	Name, NameTail string
	// Arriving, when set, limits the step to packets arriving on this interface (a rerouted
	// interface's steps).
	Arriving string
	// Direction, when set, is the direction whose lists the step holds, if not its chain's: a
	// rerouted interface's steps hold the outbound lists in the inbound chain (nftables shares
	// their sets).
	Direction string
}

// Common returns c; every step embeds a StepCommon.
func (c StepCommon) Common() StepCommon { return c }

// comment is the rule comment for step s, with items (the list items the rule covers,
// comma-separated) for a list step. It is generic so that a step type calling it per item (a
// thousand subnets) is not boxed into a Step each time.
func comment[S Step](s S, items string) string {
	c := s.Common()
	if !s.IsList() {
		return CommentPrefix + c.Name
	}
	return CommentPrefix + c.Name + items + c.NameTail
}

// portsComment names a rule over the whole of ports, each spelled by label: xtPorts ("a:b") for
// the lists matched with multiport, PortRange.String ("a-b") for redirect names. Both are
// Linkerd's.
func portsComment(c StepCommon, ports []PortRange, label func(PortRange) string) string {
	return listComment(c, len(ports), func(i int) string { return label(ports[i]) })
}
