package routing

import (
	"slices"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

var want = []iptables.PolicyRoute{
	{Family: iptables.IPv4, Mark: iptables.TPROXYMark, Table: iptables.TPROXYTable, Priority: iptables.TPROXYRulePriority},
	{Family: iptables.IPv6, Mark: iptables.TPROXYMark, Table: iptables.TPROXYTable, Priority: iptables.TPROXYRulePriority},
}

func wantLines() []string {
	return append(want[0].Lines(), want[1].Lines()...)
}

// read is Read in n, failing the test on an error.
func read(t *testing.T, n *nt.NS) []string {
	t.Helper()
	var got []string
	if err := n.Do(func() (err error) { got, err = Netlink{}.Read(); return err }); err != nil {
		t.Fatalf("read: %v", err)
	}
	return got
}

// ip is what ip(8) shows of the TPROXY table and its rules in n, both families: the kernel's
// view, independent of this package's reading.
func ip(t *testing.T, n *nt.NS) string {
	t.Helper()
	var out []string
	for _, v := range []string{"-4", "-6"} {
		for _, what := range [][]string{{"rule", "show", "table", "4143"}, {"route", "show", "table", "4143"}} {
			o, err := nt.RunIn(t, n, "ip", append([]string{v}, what...)...)
			if err != nil {
				t.Fatalf("ip %s %s: %v\n%s", v, what, err, o)
			}
			for _, l := range strings.Split(strings.TrimSpace(o), "\n") {
				out = append(out, strings.TrimSpace(l))
			}
		}
	}
	return strings.Join(slices.DeleteFunc(out, func(s string) bool { return s == "" }), "\n")
}

// TestEnsureReadPrune writes the policy routing in a fresh namespace, reads it back, undoes it,
// and prunes what another tool put at our priority and in our table.
func TestEnsureReadPrune(t *testing.T) {
	nt.RequireRoot(t, "it writes ip rules and routes in a namespace of its own")
	n := nt.NewNS(t)

	var undo func() error
	if err := n.Do(func() (err error) { undo, err = Netlink{}.Ensure(want); return err }); err != nil {
		t.Fatalf("ensure: %v", err)
	}
	if got := read(t, n); !slices.Equal(got, wantLines()) {
		t.Errorf("read after ensure:\n%q\nwant\n%q", got, wantLines())
	}
	const kernel = "4143:\tfrom all fwmark 0x102f lookup 4143\nlocal default dev lo scope host\n" +
		"4143:\tfrom all fwmark 0x102f lookup 4143\nlocal default dev lo metric 1024 pref medium"
	if got := ip(t, n); got != kernel {
		t.Errorf("ip shows:\n%s\nwant\n%s", got, kernel)
	}

	// Ensuring again adds nothing, so its undo removes nothing.
	if err := n.Do(func() error {
		again, err := Netlink{}.Ensure(want)
		if err != nil {
			return err
		}
		return again()
	}); err != nil {
		t.Fatalf("ensure again and undo that: %v", err)
	}
	if got := read(t, n); !slices.Equal(got, wantLines()) {
		t.Errorf("read after a second ensure and its undo:\n%q\nwant\n%q", got, wantLines())
	}

	if err := n.Do(undo); err != nil {
		t.Fatalf("undo: %v", err)
	}
	if got, left := read(t, n), ip(t, n); len(got) != 0 || left != "" {
		t.Errorf("after undo: read %q, ip shows:\n%s", got, left)
	}

	// Another tool's entries at our priority and in our table are shown as what they are, and
	// pruned.
	if err := n.Do(func() (err error) { _, err = Netlink{}.Ensure(want); return err }); err != nil {
		t.Fatalf("ensure: %v", err)
	}
	for _, args := range [][]string{
		{"-4", "rule", "add", "priority", "4143", "fwmark", "0x102f/0xff", "lookup", "4143"},
		{"-4", "rule", "add", "priority", "4143", "from", "192.0.2.0/24", "lookup", "4143"},
		{"-4", "route", "add", "198.51.100.0/24", "dev", "lo", "table", "4143"},
		{"-6", "route", "add", "blackhole", "2001:db8::/64", "table", "4143"},
		{"-4", "rule", "add", "priority", "4143", "fwmark", "0x102f", "lookup", "100"}, // not ours: another table
	} {
		if out, err := nt.RunIn(t, n, "ip", args...); err != nil {
			t.Fatalf("ip %s: %v\n%s", args, err, out)
		}
	}
	foreign := []string{
		"ip -4 rule: priority 4143 fwmark 0x102f lookup 4143 (mask 0xff)",
		"ip -4 rule: priority 4143 fwmark 0x0 lookup 4143 (and more: from 192.0.2.0/24 to <nil>/0 iif \"\" oif \"\" flags 0x0 tos 0 ipproto 0 sport {0 0} dport {0 0} uid {0 0})",
		"ip -4 route: type 1 to 198.51.100.0/24 via <nil> dev 1 (in table 4143, not as proxy-init writes it)",
		"ip -6 route: type 6 to 2001:db8::/64 via <nil> dev 1 (in table 4143, not as proxy-init writes it)",
	}
	got := read(t, n)
	for _, l := range append(wantLines(), foreign...) {
		if !slices.Contains(got, l) {
			t.Errorf("read lacks %q; got\n%s", l, strings.Join(got, "\n"))
		}
	}
	if len(got) != len(wantLines())+len(foreign) {
		t.Errorf("read %d lines, want %d:\n%s", len(got), len(wantLines())+len(foreign), strings.Join(got, "\n"))
	}
	if err := n.Do(func() error { return Netlink{}.Prune(want) }); err != nil {
		t.Fatalf("prune: %v", err)
	}
	if got := read(t, n); !slices.Equal(got, wantLines()) {
		t.Errorf("read after pruning the foreign entries:\n%q\nwant\n%q", got, wantLines())
	}
	if err := n.Do(func() error { return Netlink{}.Prune(nil) }); err != nil {
		t.Fatalf("prune all: %v", err)
	}
	if got, left := read(t, n), ip(t, n); len(got) != 0 || left != "" {
		t.Errorf("after pruning all: read %q, ip shows:\n%s", got, left)
	}
	// The rule of another table at our priority is not ours, and stays.
	if out, _ := nt.RunIn(t, n, "ip", "-4", "rule", "show", "priority", "4143"); !strings.Contains(out, "lookup 100") {
		t.Errorf("a rule of another table was removed; ip rule shows:\n%s", out)
	}
}
