package nftables

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/internal/netnstest"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/xtnft"
)

// newNS creates a throwaway network namespace, removed when the test ends.
func newNS(t testing.TB) ns.NetNS { return netnstest.NewNetNS(t) }

// in runs fn inside n on a locked thread.
func in(t testing.TB, n ns.NetNS, fn func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return fn() }); err != nil {
		t.Fatal(err)
	}
}

// run runs a command inside n and returns its output; the child inherits the locked thread's
// namespace.
func run(t testing.TB, n ns.NetNS, stdin string, name string, args ...string) (string, error) {
	t.Helper()
	var out []byte
	var err error
	_ = n.Do(func(ns.NetNS) error {
		cmd := exec.Command(name, args...)
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		out, err = cmd.CombinedOutput()
		return nil
	})
	return string(out), err
}

func mustRun(t testing.TB, n ns.NetNS, stdin string, name string, args ...string) string {
	t.Helper()
	out, err := run(t, n, stdin, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func build(t testing.TB, mod func(*iptables.Config)) *iptables.Ruleset {
	t.Helper()
	c := iptables.NewConfig()
	c.InboundProxyPort, c.OutboundProxyPort, c.ProxyUID = 4143, 4140, 2102
	c.InboundPortsToIgnore = []string{"4190,4191,4567,4568"}
	c.OutboundPortsToIgnore = []string{"4567,4568"}
	if mod != nil {
		mod(&c)
	}
	rs, err := iptables.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// generation reads the nftables ruleset generation, which every committed transaction bumps.
func generation(t testing.TB, n ns.NetNS) uint32 {
	t.Helper()
	var gen uint32
	in(t, n, func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
			Data:   nfgen(unix.AF_UNSPEC, 0),
		})
		if err != nil {
			return fmt.Errorf("getgen: %w", err)
		}
		ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
		if err != nil {
			return err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				gen = ad.Uint32()
			}
		}
		return ad.Err()
	})
	return gen
}

// ourTable returns our table's listing entry in n, or nil.
func ourTable(t testing.TB, n ns.NetNS) *tableInfo {
	t.Helper()
	var ti *tableInfo
	in(t, n, func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		ts, err := listTables(c)
		if err != nil {
			return err
		}
		ti = findTable(ts, inet, iptables.NFTTableName)
		return nil
	})
	return ti
}

func apply(t testing.TB, n ns.NetNS, a *Applier, rs *iptables.Ruleset) iptables.Result {
	t.Helper()
	var res iptables.Result
	in(t, n, func() error {
		var err error
		res, err = a.Apply(ctx(t), rs)
		return err
	})
	return res
}

func show(t testing.TB, n ns.NetNS, rs *iptables.Ruleset) iptables.State {
	t.Helper()
	var st iptables.State
	in(t, n, func() error {
		var err error
		st, err = New().Show(ctx(t), rs)
		return err
	})
	return st
}

// listing is `nft list table` with the handles and the set element layout normalized away.
func listing(t testing.TB, n ns.NetNS) string {
	t.Helper()
	return mustRun(t, n, "", "nft", "list", "table", "inet", iptables.NFTTableName)
}

func TestApplyShowReapplyCleanup(t *testing.T) {
	n := newNS(t)
	rs := build(t, func(c *iptables.Config) {
		c.InboundSubnetsToIgnore = []string{"198.51.100.0/24,2001:db8:1::/48"}
		c.OutboundSubnetsToIgnore = []string{"192.0.2.0/25,203.0.113.0/30,203.0.113.4", "2001:db8:2::/64,2001:db8:3::1"}
	})
	a := New()
	if res := apply(t, n, a, rs); !res.Changed {
		t.Fatal("first apply reported no change")
	}
	got := listing(t, n)
	for _, want := range []string{
		`comment "` + rs.NFTComment() + `"`,
		"type nat hook prerouting priority dstnat; policy accept;",
		"type nat hook output priority -100; policy accept;",
		`meta skuid 2102 return comment "proxy-init/ignore-proxy-user-id"`,
		`oifname "lo" return comment "proxy-init/ignore-loopback"`,
		"ip6 daddr @outbound_ignore_subnets_v6 return",
		`meta l4proto tcp redirect to :4140 comment "proxy-init/redirect-all-outgoing-to-proxy-port"`,
		"elements = { 4190-4191, 4567-4568 }",
		"2001:db8:3::1 }",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("nft list lacks %q:\n%s", want, got)
		}
	}
	if st := show(t, n, rs); !st.Match() {
		t.Errorf("show after apply does not match:\n%s", st.Families[0].Diff)
	}

	// The table holds exactly our chains and sets.
	if use := ourTable(t, n).Use; use != uint32(2+len(rs.NFT().Sets)) {
		t.Errorf("table use count %d, want %d chains and sets", use, 2+len(rs.NFT().Sets))
	}

	// Re-apply: nothing written, proven by the ruleset generation and the table handle.
	gen, handle := generation(t, n), ourTable(t, n).Handle
	if res := apply(t, n, a, rs); res.Changed {
		t.Error("re-apply with the same plan reported a change")
	}
	if g := generation(t, n); g != gen {
		t.Errorf("re-apply committed a transaction: generation %d -> %d", gen, g)
	}
	if h := ourTable(t, n).Handle; h != handle {
		t.Errorf("re-apply replaced the table: handle %d -> %d", handle, h)
	}

	// Cleanup leaves nothing, and is idempotent.
	in(t, n, func() error { return a.Cleanup(ctx(t)) })
	if out := mustRun(t, n, "", "nft", "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Errorf("ruleset after cleanup:\n%s", out)
	}
	gen = generation(t, n)
	in(t, n, func() error { return a.Cleanup(ctx(t)) })
	if g := generation(t, n); g != gen {
		t.Errorf("second cleanup wrote: generation %d -> %d", gen, g)
	}
	if st := show(t, n, rs); st.Match() || len(st.Families[0].Diff.Missing) == 0 {
		t.Errorf("show after cleanup should report everything missing: %+v", st)
	}
}

// goldenCases mirrors the builder's golden config matrix.
func goldenCases() map[string]func(*iptables.Config) {
	return map[string]func(*iptables.Config){
		"chart-defaults":  nil,
		"redirect-listed": func(c *iptables.Config) { c.PortsToRedirect = []string{"8080,9090", "10000-10010"} },
		"more-than-15-ports": func(c *iptables.Config) {
			c.InboundPortsToIgnore = []string{"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"}
			c.OutboundPortsToIgnore = []string{"21,22,23,24,25,26,27,28,29,30,31,32,33,34,35"}
		},
		"ranges": func(c *iptables.Config) {
			c.InboundPortsToIgnore = []string{"4190-4191,5000", "6000-7000,8000-9000"}
			c.OutboundPortsToIgnore = []string{"25-26,1-10,65000-65535"}
		},
		"uid-and-gid": func(c *iptables.Config) { c.ProxyGID = 2103 },
		"mixed-subnets": func(c *iptables.Config) {
			c.InboundSubnetsToIgnore = []string{"198.51.100.0/24,2001:db8:1::/48", "203.0.113.7"}
			c.OutboundSubnetsToIgnore = []string{"192.0.2.0/25", "2001:db8:2::/64,2001:db8:3::1", "0.0.0.0/0"}
		},
		"ipv6-off": func(c *iptables.Config) {
			c.IPv6 = false
			c.InboundSubnetsToIgnore = []string{"198.51.100.0/24", "2001:db8:1::/48"}
		},
		"control-plane": func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"443,6443"} },
	}
}

// The --simulate script is accepted by nft -c, writes nothing when checked, and nft -f of it
// makes a table that Show reports as matching and that Apply then leaves alone; Apply's table
// in turn lists exactly like the script's.
func TestScriptAndApplierAgree(t *testing.T) {
	for name, mod := range goldenCases() {
		t.Run(name, func(t *testing.T) {
			rs := build(t, mod)
			script := rs.NFTScript()

			viaNFT := newNS(t)
			gen := generation(t, viaNFT)
			mustRun(t, viaNFT, script, "nft", "-c", "-f", "-")
			if g := generation(t, viaNFT); g != gen {
				t.Errorf("nft -c committed something: generation %d -> %d", gen, g)
			}
			mustRun(t, viaNFT, script, "nft", "-f", "-")
			mustRun(t, viaNFT, script, "nft", "-f", "-") // the script is re-runnable
			if st := show(t, viaNFT, rs); !st.Match() {
				t.Errorf("show of the nft -f table does not match:\n%s", st.Families[0].Diff)
			}
			gen = generation(t, viaNFT)
			if res := apply(t, viaNFT, New(), rs); res.Changed {
				t.Error("apply over the identical nft -f table rewrote it")
			}
			if g := generation(t, viaNFT); g != gen {
				t.Errorf("apply over the identical table committed: generation %d -> %d", gen, g)
			}

			viaApplier := newNS(t)
			apply(t, viaApplier, New(), rs)
			if a, b := listing(t, viaNFT), listing(t, viaApplier); a != b {
				t.Errorf("nft -f and the applier list differently:\n--- nft -f\n%s\n--- applier\n%s", a, b)
			}

			// What show reports is nft syntax too: replayed by nft, it makes the same table.
			replayed := newNS(t)
			st := show(t, viaApplier, rs)
			mustRun(t, replayed, strings.Join(st.Families[0].Rules, "\n")+"\n", "nft", "-f", "-")
			if st := show(t, replayed, rs); !st.Match() {
				t.Errorf("show's statements replayed by nft do not match:\n%s", st.Families[0].Diff)
			}
		})
	}
}

// A config change replaces the table in exactly one transaction.
func TestConfigChangeIsOneTransaction(t *testing.T) {
	n := newNS(t)
	a := New()
	apply(t, n, a, build(t, nil))
	gen := generation(t, n)
	next := build(t, func(c *iptables.Config) {
		c.OutboundPortsToIgnore = []string{"443,6443"}
		c.OutboundSubnetsToIgnore = []string{"192.0.2.0/24"}
	})
	if res := apply(t, n, a, next); !res.Changed {
		t.Fatal("changed config reported no change")
	}
	if g := generation(t, n); g != gen+1 {
		t.Errorf("config change took %d transactions, want 1", g-gen)
	}
	if st := show(t, n, next); !st.Match() {
		t.Errorf("after the change:\n%s", st.Families[0].Diff)
	}
	if st := show(t, n, build(t, nil)); st.Match() {
		t.Error("old config still matches after the change")
	}
}

// A table changed behind our back is rewritten even though its plan comment still matches.
func TestTamperedTableIsRepaired(t *testing.T) {
	tests := []struct {
		name   string
		tamper string
	}{
		{"rule deleted", "flush chain inet proxy_init PROXY_INIT_OUTPUT"},
		{"rule added", `add rule inet proxy_init PROXY_INIT_OUTPUT tcp dport 22 return`},
		{"set element added", "add element inet proxy_init outbound_ignore_ports { 22 }"},
		{"chain deleted", "delete chain inet proxy_init PROXY_INIT_REDIRECT"},
		{"object added", "add counter inet proxy_init stray"},
	}
	rs := build(t, nil)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := newNS(t)
			// Sets are written constant, and the kernel refuses new elements in a constant set;
			// for the element case, start from the script's table with non-constant sets (same
			// plan comment), which Apply must also replace.
			if strings.Contains(tt.tamper, "element") {
				mustRun(t, n, strings.ReplaceAll(rs.NFTScript(), "flags constant,interval", "flags interval"), "nft", "-f", "-")
			} else {
				apply(t, n, New(), rs)
			}
			if out, err := run(t, n, "", "nft", tt.tamper); err != nil {
				t.Fatalf("tamper: %v\n%s", err, out)
			}
			if st := show(t, n, rs); st.Match() {
				t.Fatal("show does not see the tampering")
			}
			if res := apply(t, n, New(), rs); !res.Changed {
				t.Error("apply left the tampered table alone")
			}
			if st := show(t, n, rs); !st.Match() {
				t.Errorf("after repair:\n%s", st.Families[0].Diff)
			}
		})
	}
}

// iptables-nft chains and jumps of ours, written by the iptables binaries, are removed by an
// nftables apply in the same transaction; other rules in the nat tables stay.
func TestApplyRemovesIptablesNFTRules(t *testing.T) {
	for _, bin := range []string{"iptables-nft-restore", "ip6tables-nft-restore", "iptables-nft-save", "ip6tables-nft-save"} {
		if _, err := exec.LookPath(bin); err != nil {
			t.Fatalf("%s not installed (make deps installs it): %v", bin, err)
		}
	}
	n := newNS(t)
	rs := build(t, nil)
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		restore := map[iptables.Family]string{iptables.IPv4: "iptables-nft-restore", iptables.IPv6: "ip6tables-nft-restore"}[f]
		payload := iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f))
		mustRun(t, n, payload, restore, "--noflush")
		mustRun(t, n, "*nat\n-A OUTPUT -p udp --dport 53 -j ACCEPT\nCOMMIT\n", restore, "--noflush")
	}
	gen := generation(t, n)
	if res := apply(t, n, New(), rs); !res.Changed {
		t.Fatal("apply reported no change")
	}
	if g := generation(t, n); g != gen+1 {
		t.Errorf("apply and removal took %d transactions, want 1", g-gen)
	}
	for _, save := range []string{"iptables-nft-save", "ip6tables-nft-save"} {
		out := mustRun(t, n, "", save, "-t", "nat")
		if strings.Contains(out, "PROXY_INIT") {
			t.Errorf("%s still shows our chains:\n%s", save, out)
		}
		if !strings.Contains(out, "--dport 53 -j ACCEPT") {
			t.Errorf("%s lost a foreign rule:\n%s", save, out)
		}
	}
	if st := show(t, n, rs); !st.Match() {
		t.Errorf("show after switching:\n%s", st.Families[0].Diff)
	}

	// Standalone removal, as the backend runner does it when switching away from iptables-nft
	// without writing our table: put iptables-nft rules back; the netlink writer lists them and
	// removes them (two chains, two jumps) and leaves our table alone.
	mustRun(t, n, iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(iptables.IPv4)), "iptables-nft-restore", "--noflush")
	x := xtnft.New()
	var present []string
	in(t, n, func() error {
		var err error
		present, err = x.Present(ctx(t))
		return err
	})
	got := strings.Join(present, "\n")
	for _, w := range []string{"ipv4: chain PROXY_INIT_OUTPUT", "ipv4: chain PROXY_INIT_REDIRECT", "ipv4: -A PREROUTING -m comment", "ipv4: -A OUTPUT -m comment"} {
		if !strings.Contains(got, w) {
			t.Errorf("the netlink writer does not list %q among the iptables-nft rules:\n%s", w, got)
		}
	}
	in(t, n, func() error { return x.Cleanup(ctx(t)) })
	if out := mustRun(t, n, "", "iptables-nft-save", "-t", "nat"); strings.Contains(out, "PROXY_INIT") {
		t.Errorf("iptables-nft rules left:\n%s", out)
	}
	if st := show(t, n, rs); !st.Match() {
		t.Errorf("our table was touched:\n%s", st.Families[0].Diff)
	}
}

// With no binaries on PATH the backend still works: it never execs.
func TestWorksWithEmptyPATH(t *testing.T) {
	n := newNS(t)
	t.Setenv("PATH", "")
	if _, err := exec.LookPath("nft"); err == nil {
		t.Fatal("nft still found with an empty PATH")
	}
	rs := build(t, nil)
	in(t, n, func() error {
		a := New()
		if _, err := a.Apply(ctx(t), rs); err != nil {
			return err
		}
		st, err := a.Show(ctx(t), rs)
		if err != nil {
			return err
		}
		if !st.Match() {
			return fmt.Errorf("show: %s", st.Families[0].Diff)
		}
		return a.Cleanup(ctx(t))
	})
	if ti := ourTable(t, n); ti != nil {
		t.Errorf("table left after cleanup: %+v", ti)
	}
}

// A batch the kernel refuses writes nothing: the table in place stays as it was, and the
// error names the refused message.
func TestRefusedBatchWritesNothing(t *testing.T) {
	n := newNS(t)
	old := build(t, nil)
	apply(t, n, New(), old)
	gen, handle := generation(t, n), ourTable(t, n).Handle

	bad := build(t, func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"443"} }).NFT()
	// A comment longer than the kernel's user data limit (256 bytes) on the last rule.
	out := &bad.Chains[1]
	out.Rules[len(out.Rules)-1].Comment = strings.Repeat("x", 300)
	var err error
	in(t, n, func() error {
		s, err0 := open(ctx(t), options{})
		if err0 != nil {
			return err0
		}
		defer s.close()
		var b batch
		b.replaceTable(bad)
		err = b.send(s.nl)
		return nil
	})
	var be *BatchError
	if !errors.As(err, &be) || !strings.Contains(be.What, "add rule PROXY_INIT_OUTPUT meta l4proto tcp redirect to :4140") {
		t.Fatalf("want a BatchError naming the redirect rule, got %v", err)
	}
	if g := generation(t, n); g != gen {
		t.Errorf("refused batch committed: generation %d -> %d", gen, g)
	}
	if ti := ourTable(t, n); ti == nil || ti.Handle != handle || ti.Comment != old.NFTComment() {
		t.Errorf("table changed by a refused batch: %+v", ti)
	}
	if st := show(t, n, old); !st.Match() {
		t.Errorf("old rules damaged:\n%s", st.Families[0].Diff)
	}

	// A nil ruleset, or one that did not come from Build (a zero proxy port), is refused
	// before anything is sent.
	in(t, n, func() error {
		if _, err := New().Apply(ctx(t), nil); err == nil {
			return errors.New("apply of a nil ruleset succeeded")
		}
		_, err := New().Apply(ctx(t), &iptables.Ruleset{Families: []iptables.Family{iptables.IPv4}, ProxyUID: -1, ProxyGID: -1})
		if err == nil || !strings.Contains(err.Error(), "redirect to port 0") {
			return fmt.Errorf("apply of a zero-port ruleset: %v, want a refusal", err)
		}
		return nil
	})
	if g := generation(t, n); g != gen {
		t.Errorf("generation moved: %d -> %d", gen, g)
	}
}

// Big lists: sets split over several messages still make one transaction and read back equal.
func TestLargeSets(t *testing.T) {
	n := newNS(t)
	var v4, v6, ports []string
	for i := range 1000 {
		v4 = append(v4, fmt.Sprintf("10.%d.%d.0/24", i/256, i%256))
		v6 = append(v6, fmt.Sprintf("2001:db8:%x::/48", i*2))
	}
	for i := range 200 {
		ports = append(ports, fmt.Sprintf("%d-%d", 10000+i*10, 10000+i*10+5))
	}
	rs := build(t, func(c *iptables.Config) {
		c.OutboundSubnetsToIgnore = append(v4, v6...)
		c.OutboundPortsToIgnore = ports
	})
	gen := generation(t, n)
	apply(t, n, New(), rs)
	if g := generation(t, n); g != gen+1 {
		t.Errorf("large apply took %d transactions, want 1", g-gen)
	}
	if st := show(t, n, rs); !st.Match() {
		t.Errorf("large table does not read back:\n%s", st.Families[0].Diff)
	}
	// nft agrees on the element count.
	out := mustRun(t, n, "", "nft", "list", "set", "inet", iptables.NFTTableName, "outbound_ignore_subnets_v6")
	if c := strings.Count(out, "::/48"); c != 1000 {
		t.Errorf("nft lists %d v6 elements, want 1000", c)
	}
}

// WithNetNS writes into the namespace of the fd, not the caller's. The caller itself runs in
// another throwaway namespace, so a mistake cannot reach the machine's own.
func TestWithNetNS(t *testing.T) {
	target, caller := newNS(t), newNS(t)
	f, err := os.Open(target.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rs := build(t, nil)
	in(t, caller, func() error {
		_, err := New(WithNetNS(int(f.Fd()))).Apply(ctx(t), rs)
		return err
	})
	if ourTable(t, target) == nil {
		t.Error("no table in the target namespace")
	}
	if ti := ourTable(t, caller); ti != nil {
		t.Errorf("table written into the caller's namespace: %+v", ti)
	}
}

// Concurrent applies of different plans in one namespace both succeed (the kernel serializes
// the batches) and leave exactly one of the two tables.
func TestConcurrentApplies(t *testing.T) {
	n := newNS(t)
	a := build(t, nil)
	b := build(t, func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"443,6443"} })
	errs := make(chan error, 20)
	for i := range 20 {
		go func() {
			rs := a
			if i%2 == 1 {
				rs = b
			}
			errs <- n.Do(func(ns.NetNS) error {
				_, err := New().Apply(ctx(t), rs)
				return err
			})
		}()
	}
	for range 20 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if show(t, n, a).Match() == show(t, n, b).Match() {
		t.Errorf("want exactly one plan in place:\n%s", listing(t, n))
	}
}
