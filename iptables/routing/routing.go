// Package routing writes, reads back and removes the policy routing TPROXY needs beside its
// rules (iptables.PolicyRoute): per family, an ip rule sending TPROXY's mark to a route table of
// ours, holding a local default route, so marked packets are delivered here. It speaks rtnetlink
// in the calling thread's network namespace, and decides nothing (Ruleset.PolicyRoutes does).
// What is ours needs no configuration: the ip rules at iptables.TPROXYRulePriority that look up
// iptables.TPROXYTable, and every route in that table.
package routing

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/jsimonetti/rtnetlink/v2"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// Netlink is the policy routing of the calling thread's network namespace.
type Netlink struct{}

// Read returns the policy routing of ours in place, as iptables.PolicyRoute.Lines renders it,
// family by family, each family's rules before its routes.
func (Netlink) Read() ([]string, error) {
	o, err := readOurs()
	if err != nil {
		return nil, err
	}
	defer o.c.Close()
	var out []string
	for i, f := range families {
		for _, r := range o.rules[i] {
			out = append(out, ruleLine(f, r))
		}
		for _, r := range o.routes[i] {
			out = append(out, routeLine(f, r))
		}
	}
	return out, nil
}

// Ensure adds what of want is missing, and returns what undoes exactly that, for when the rules
// that need it fail. Routes go in before their rules, so no marked packet meets an empty table.
func (Netlink) Ensure(want []iptables.PolicyRoute) (undo func() error, err error) {
	var added []func(*rtnetlink.Conn) error
	undo = func() error {
		c, err := rtnetlink.Dial(nil)
		if err != nil {
			return fmt.Errorf("open an rtnetlink socket: %w", err)
		}
		defer c.Close()
		var errs []error
		for i := len(added) - 1; i >= 0; i-- {
			errs = append(errs, added[i](c))
		}
		return errors.Join(errs...)
	}
	if len(want) == 0 {
		return undo, nil
	}
	o, err := readOurs()
	if err != nil {
		return nil, err
	}
	defer o.c.Close()
	for _, p := range want {
		i, lines := slices.Index(families[:], p.Family), p.Lines()
		if !slices.ContainsFunc(o.routes[i], func(r rtnetlink.RouteMessage) bool { return routeLine(p.Family, r) == lines[1] }) {
			r := &rtnetlink.RouteMessage{Family: afs[i], Protocol: unix.RTPROT_BOOT, Scope: unix.RT_SCOPE_HOST,
				Type: unix.RTN_LOCAL, Attributes: rtnetlink.RouteAttributes{Table: p.Table, OutIface: loopback}}
			if err := o.c.Route.Add(r); err != nil {
				if errors.Is(err, unix.ENETDOWN) {
					// The kernel refuses an IPv6 route through a loopback that is down.
					err = fmt.Errorf("%w: the namespace's loopback interface is down (TPROXY delivers through it; bring lo up first, as every pod runtime does)", err)
				}
				return nil, errors.Join(fmt.Errorf("add %s: %w", lines[1], err), undo())
			}
			added = append(added, func(c *rtnetlink.Conn) error { return del(lines[1], c.Route.Delete(r)) })
		}
		if !slices.ContainsFunc(o.rules[i], func(r rtnetlink.RuleMessage) bool { return ruleLine(p.Family, r) == lines[0] }) {
			prio := uint32(p.Priority)
			r := &rtnetlink.RuleMessage{Family: afs[i], Action: unix.FR_ACT_TO_TBL,
				Attributes: &rtnetlink.RuleAttributes{Priority: &prio, FwMark: &p.Mark, Table: &p.Table}}
			if err := o.c.Rule.Add(r); err != nil {
				return nil, errors.Join(fmt.Errorf("add %s: %w", lines[0], err), undo())
			}
			added = append(added, func(c *rtnetlink.Conn) error { return del(lines[0], c.Rule.Delete(r)) })
		}
	}
	return undo, nil
}

// Prune removes every rule and route of ours that want does not hold (all, for cleanup). Rules
// go first: one left without its route sends marked packets on to the main table, harmlessly.
func (Netlink) Prune(want []iptables.PolicyRoute) error {
	o, err := readOurs()
	if err != nil {
		return err
	}
	defer o.c.Close()
	var keep []string
	for _, p := range want {
		keep = append(keep, p.Lines()...)
	}
	var errs []error
	for i, f := range families {
		for _, r := range o.rules[i] {
			if l := ruleLine(f, r); !slices.Contains(keep, l) {
				errs = append(errs, del(l, o.c.Rule.Delete(&r)))
			}
		}
	}
	for i, f := range families {
		for _, r := range o.routes[i] {
			if l := routeLine(f, r); !slices.Contains(keep, l) {
				errs = append(errs, del(l, o.c.Route.Delete(&r)))
			}
		}
	}
	return errors.Join(errs...)
}

// families are ours in the order Read renders them, and afs rtnetlink's number of each. Arrays
// of constants: the CNI plugin links this package and runs no package initialiser of ours.
var (
	families = [2]iptables.Family{iptables.IPv4, iptables.IPv6}
	afs      = [2]uint8{unix.AF_INET, unix.AF_INET6}
)

// loopback is lo's interface index, the same in every network namespace (the kernel's
// LOOPBACK_IFINDEX), so no lookup is needed.
const loopback = 1

// current is what of ours one read found, by family, and the socket it was read over.
type current struct {
	c      *rtnetlink.Conn
	rules  [2][]rtnetlink.RuleMessage
	routes [2][]rtnetlink.RouteMessage
}

// readOurs reads what of ours is in place over one rtnetlink socket, which the caller closes.
func readOurs() (*current, error) {
	c, err := rtnetlink.Dial(nil)
	if err != nil {
		return nil, fmt.Errorf("open an rtnetlink socket: %w", err)
	}
	o := &current{c: c}
	rules, err := c.Rule.List()
	if errors.Is(err, unix.EOPNOTSUPP) {
		// qemu-user translates rtnetlink but not its ip rules: where they cannot be listed none
		// can have been written (TPROXY, which adds one, fails there with this error).
		rules, err = nil, nil
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("list the ip rules: %w", err)
	}
	for _, r := range rules {
		if i := slices.Index(afs[:], r.Family); i >= 0 && r.Attributes != nil && value(r.Attributes.Priority) == iptables.TPROXYRulePriority &&
			value(r.Attributes.Table) == iptables.TPROXYTable {
			o.rules[i] = append(o.rules[i], r)
		}
	}
	routes, err := c.Route.List()
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("list the routes of table %d: %w", iptables.TPROXYTable, err)
	}
	for _, r := range routes {
		if i := slices.Index(afs[:], r.Family); i >= 0 && r.Attributes.Table == iptables.TPROXYTable {
			o.routes[i] = append(o.routes[i], r)
		}
	}
	return o, nil
}

func value[T any](p *T) (v T) {
	if p != nil {
		v = *p
	}
	return v
}

func del(what string, err error) error {
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return nil // gone already: what a removal wants
	}
	return fmt.Errorf("remove %s: %w", what, err)
}

// ruleLine renders a rule of ours as iptables.PolicyRoute.Lines does; anything beyond a mark shows.
func ruleLine(f iptables.Family, r rtnetlink.RuleMessage) string {
	a := r.Attributes
	p := iptables.PolicyRoute{Family: f, Mark: value(a.FwMark), Table: value(a.Table), Priority: int(value(a.Priority))}
	l := p.Lines()[0]
	if a.FwMask != nil && *a.FwMask != 0xffffffff {
		l += fmt.Sprintf(" (mask %#x)", *a.FwMask)
	}
	if a.Src != nil || a.Dst != nil || a.IIFName != nil || a.OIFName != nil || r.Flags&unix.FIB_RULE_INVERT != 0 ||
		a.IPProto != nil || a.SPortRange != nil || a.DPortRange != nil || a.UIDRange != nil || r.TOS != 0 {
		l += fmt.Sprintf(" (and more: from %v/%d to %v/%d iif %q oif %q flags %#x tos %d ipproto %d sport %v dport %v uid %v)",
			value(a.Src), r.SrcLength, value(a.Dst), r.DstLength, value(a.IIFName), value(a.OIFName), r.Flags, r.TOS,
			value(a.IPProto), value(a.SPortRange), value(a.DPortRange), value(a.UIDRange))
	}
	return l
}

// routeLine renders a route of our table as iptables.PolicyRoute.Lines does, or as what it is.
func routeLine(f iptables.Family, r rtnetlink.RouteMessage) string {
	a := r.Attributes
	if r.DstLength == 0 && r.Type == unix.RTN_LOCAL && a.OutIface == loopback && a.Gateway == nil {
		return iptables.PolicyRoute{Family: f, Table: a.Table}.Lines()[1]
	}
	return fmt.Sprintf("%s: type %d to %s/%d via %s dev %d (in table %d, not as proxy-init writes it)",
		strings.Split(iptables.PolicyRoute{Family: f}.Lines()[1], ":")[0], r.Type, a.Dst, r.DstLength, a.Gateway, a.OutIface, a.Table)
}
