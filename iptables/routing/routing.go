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
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// Netlink is the policy routing of the calling thread's network namespace.
type Netlink struct{}

// Read returns the policy routing of ours in place, as iptables.PolicyRoute.Lines renders it,
// family by family, each family's rules before its routes.
func (Netlink) Read() ([]string, error) {
	o, err := readOurs(false)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range families {
		for _, r := range o.rules[f] {
			out = append(out, ruleLine(f, r))
		}
		for _, r := range o.routes[f] {
			out = append(out, o.routeLine(f, r))
		}
	}
	return out, nil
}

// Ensure adds what of want is missing, and returns what undoes exactly that, for when the rules
// that need it fail. Routes go in before their rules, so no marked packet meets an empty table.
func (Netlink) Ensure(want []iptables.PolicyRoute) (undo func() error, err error) {
	var added []func() error
	undo = func() error {
		var errs []error
		for i := len(added) - 1; i >= 0; i-- {
			errs = append(errs, added[i]())
		}
		return errors.Join(errs...)
	}
	if len(want) == 0 {
		return undo, nil
	}
	o, err := readOurs(true)
	if err != nil {
		return nil, err
	}
	for _, p := range want {
		lines := p.Lines()
		if !slices.ContainsFunc(o.routes[p.Family], func(r netlink.Route) bool { return o.routeLine(p.Family, r) == lines[1] }) {
			dst := &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
			if p.Family == iptables.IPv4 {
				dst = &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
			}
			r := &netlink.Route{Family: nlFamily(p.Family), Type: unix.RTN_LOCAL, Scope: netlink.SCOPE_HOST,
				Table: int(p.Table), LinkIndex: o.lo, Dst: dst}
			if err := netlink.RouteAdd(r); err != nil {
				if errors.Is(err, unix.ENETDOWN) {
					// The kernel refuses an IPv6 route through a loopback that is down.
					err = fmt.Errorf("%w: the namespace's loopback interface is down (TPROXY delivers through it; bring lo up first, as every pod runtime does)", err)
				}
				return nil, errors.Join(fmt.Errorf("add %s: %w", lines[1], err), undo())
			}
			added = append(added, func() error { return del(lines[1], netlink.RouteDel(r)) })
		}
		if !slices.ContainsFunc(o.rules[p.Family], func(r netlink.Rule) bool { return ruleLine(p.Family, r) == lines[0] }) {
			r := netlink.NewRule()
			r.Family, r.Priority, r.Table, r.Mark = nlFamily(p.Family), p.Priority, int(p.Table), p.Mark
			if err := netlink.RuleAdd(r); err != nil {
				return nil, errors.Join(fmt.Errorf("add %s: %w", lines[0], err), undo())
			}
			added = append(added, func() error { return del(lines[0], netlink.RuleDel(r)) })
		}
	}
	return undo, nil
}

// Prune removes every rule and route of ours that want does not hold (all, for cleanup). Rules
// go first: one left without its route sends marked packets on to the main table, harmlessly.
func (Netlink) Prune(want []iptables.PolicyRoute) error {
	o, err := readOurs(false)
	if err != nil {
		return err
	}
	var keep []string
	for _, p := range want {
		keep = append(keep, p.Lines()...)
	}
	var errs []error
	for _, f := range families {
		for i := range o.rules[f] {
			if l := ruleLine(f, o.rules[f][i]); !slices.Contains(keep, l) {
				errs = append(errs, del(l, netlink.RuleDel(&o.rules[f][i])))
			}
		}
	}
	for _, f := range families {
		for i := range o.routes[f] {
			if l := o.routeLine(f, o.routes[f][i]); !slices.Contains(keep, l) {
				errs = append(errs, del(l, netlink.RouteDel(&o.routes[f][i])))
			}
		}
	}
	return errors.Join(errs...)
}

var families = []iptables.Family{iptables.IPv4, iptables.IPv6}

// nlFamily is netlink's number of a family. Functions, not maps: the CNI plugin links this package
// and runs no package initialiser of ours.
func nlFamily(f iptables.Family) int {
	if f == iptables.IPv6 {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

// ourFamily is nlFamily the other way round; false for other families.
func ourFamily(nl int) (iptables.Family, bool) {
	f := iptables.IPv4
	if nl == netlink.FAMILY_V6 {
		f = iptables.IPv6
	}
	return f, nlFamily(f) == nl
}

// current is what of ours one read found, by family, and the loopback interface's index.
type current struct {
	rules  map[iptables.Family][]netlink.Rule
	routes map[iptables.Family][]netlink.Route
	lo     int
}

// readOurs reads what of ours is in place over one rtnetlink socket; the loopback interface only
// when withLo or a route of our table needs it (most pods have none, and every ADD prunes).
func readOurs(withLo bool) (*current, error) {
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open an rtnetlink socket: %w", err)
	}
	defer h.Close()
	o := &current{rules: map[iptables.Family][]netlink.Rule{}, routes: map[iptables.Family][]netlink.Route{}}
	rules, err := h.RuleList(netlink.FAMILY_ALL)
	if errors.Is(err, unix.EOPNOTSUPP) {
		// qemu-user translates rtnetlink but not its ip rules: where they cannot be listed none
		// can have been written (TPROXY, which adds one, fails there with this error).
		rules, err = nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list the ip rules: %w", err)
	}
	for _, r := range rules {
		if f, ok := ourFamily(r.Family); ok && r.Priority == iptables.TPROXYRulePriority &&
			r.Table == int(iptables.TPROXYTable) {
			o.rules[f] = append(o.rules[f], r)
		}
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: int(iptables.TPROXYTable)}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list the routes of table %d: %w", iptables.TPROXYTable, err)
	}
	for _, r := range routes {
		if f, ok := ourFamily(r.Family); ok {
			o.routes[f] = append(o.routes[f], r)
		}
	}
	if withLo || len(routes) > 0 {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return nil, fmt.Errorf("find the loopback interface: %w", err)
		}
		o.lo = lo.Attrs().Index
	}
	return o, nil
}

func del(what string, err error) error {
	if err == nil || errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		return nil // gone already: what a removal wants
	}
	return fmt.Errorf("remove %s: %w", what, err)
}

// ruleLine renders a rule of ours as iptables.PolicyRoute.Lines does; anything beyond a mark shows.
func ruleLine(f iptables.Family, r netlink.Rule) string {
	p := iptables.PolicyRoute{Family: f, Mark: r.Mark, Table: uint32(r.Table), Priority: r.Priority}
	l := p.Lines()[0]
	if r.Mask != nil && *r.Mask != 0xffffffff {
		l += fmt.Sprintf(" (mask %#x)", *r.Mask)
	}
	if r.Src != nil || r.Dst != nil || r.IifName != "" || r.OifName != "" || r.Invert {
		l += " (and more: " + r.String() + ")"
	}
	return l
}

// routeLine renders a route of our table as iptables.PolicyRoute.Lines does, or as what it is.
func (o *current) routeLine(f iptables.Family, r netlink.Route) string {
	def := r.Dst == nil
	if r.Dst != nil {
		ones, _ := r.Dst.Mask.Size()
		def = ones == 0 && r.Dst.IP.IsUnspecified()
	}
	if def && r.Type == unix.RTN_LOCAL && r.LinkIndex == o.lo {
		return iptables.PolicyRoute{Family: f, Table: uint32(r.Table)}.Lines()[1]
	}
	v := "-4"
	if f == iptables.IPv6 {
		v = "-6"
	}
	return fmt.Sprintf("ip %s route: %s (in table %d, not as proxy-init writes it)", v, r.String(), r.Table)
}
