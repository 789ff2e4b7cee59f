package nfnl

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// nativeApplier is the nftables mode's writer: the native table, clearing iptables-nft's rules.
func nativeApplier() *Applier { return New(iptables.BackendNFTables, iptables.BackendNFT) }

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// in runs fn inside n on a locked thread.
func in(t testing.TB, n *nt.NS, fn func() error) {
	t.Helper()
	if err := n.Do(fn); err != nil {
		t.Fatal(err)
	}
}

func mustRun(t testing.TB, n *nt.NS, stdin string, name string, args ...string) string {
	t.Helper()
	out, _ := nt.Output(t, n, stdin, name, args...)
	return out
}

// generation reads the ruleset generation, which every committed transaction bumps.
func generation(t testing.TB, n *nt.NS) uint32 {
	t.Helper()
	s := state(t, n)
	return s.gen
}

// state reads the table list in n.
func state(t testing.TB, n *nt.NS) *State {
	t.Helper()
	var s *State
	in(t, n, func() (err error) {
		s, err = readOnce(ctx(t), func(*State) detail { return detail{} })
		return err
	})
	return s
}

// ourTable returns our table's listing entry in n, or nil.
func ourTable(t testing.TB, n *nt.NS) *table {
	t.Helper()
	return state(t, n).findTable(famInet, iptables.NFTTableName)
}

func applyWith(t testing.TB, n *nt.NS, a *Applier, rs *iptables.Ruleset) iptables.Result {
	t.Helper()
	var res iptables.Result
	in(t, n, func() (err error) {
		res, err = a.Apply(ctx(t), rs)
		return err
	})
	return res
}

func showWith(t testing.TB, n *nt.NS, a *Applier, rs *iptables.Ruleset) iptables.State {
	t.Helper()
	var st iptables.State
	in(t, n, func() (err error) {
		st, err = a.Show(ctx(t), rs)
		return err
	})
	return st
}

func build(t testing.TB, mod func(*iptables.Config)) *iptables.Ruleset {
	t.Helper()
	c := iptablestest.ChartConfig()
	if mod != nil {
		mod(&c)
	}
	return iptablestest.Build(t, c)
}

// listing is `nft list table` of ours.
func listing(t testing.TB, n *nt.NS) string {
	t.Helper()
	return mustRun(t, n, "", "nft", "list", "table", "inet", iptables.NFTTableName)
}

// nativeCases are the golden configs and the edges of the key spaces: a range up to port 65535
// (whose end no set element marks) and a subnet covering every address.
func nativeCases() map[string]iptables.Config {
	cases := iptablestest.GoldenConfigs()
	c := iptablestest.ChartConfig()
	c.OutboundPortsToIgnore = []string{"25-26,1-10,65000-65535"}
	c.OutboundSubnetsToIgnore = []string{"192.0.2.0/25", "0.0.0.0/0", "2001:db8::1"}
	cases["key-space-edges"] = c
	return cases
}

func TestNativeApplyShowReapplyCleanup(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	rs := build(t, func(c *iptables.Config) {
		c.InboundSubnetsToIgnore = []string{"198.51.100.0/24,2001:db8:1::/48"}
		c.OutboundSubnetsToIgnore = []string{"192.0.2.0/25,203.0.113.0/30,203.0.113.4", "2001:db8:2::/64,2001:db8:3::1"}
	})
	a := nativeApplier()
	if res := applyWith(t, n, a, rs); !res.Changed {
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
	if st := showWith(t, n, a, rs); !st.Match() {
		t.Errorf("show after apply does not match:\n%s", st.Families[0].Diff)
	}
	// The table holds exactly our chains and sets.
	if use := ourTable(t, n).use; use != uint32(2+len(rs.NFT().Sets)) {
		t.Errorf("table use count %d, want %d chains and sets", use, 2+len(rs.NFT().Sets))
	}
	// Re-apply: nothing written, proven by the ruleset generation and the table handle.
	gen, handle := generation(t, n), ourTable(t, n).handle
	if res := applyWith(t, n, a, rs); res.Changed {
		t.Error("re-apply with the same plan reported a change")
	}
	if g := generation(t, n); g != gen {
		t.Errorf("re-apply committed a transaction: generation %d -> %d", gen, g)
	}
	if h := ourTable(t, n).handle; h != handle {
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
	if st := showWith(t, n, a, rs); st.Match() || len(st.Families[0].Diff.Missing) == 0 {
		t.Errorf("show after cleanup should report everything missing: %+v", st)
	}
}

// nft -f of the nft script of a table makes a table that Show reports as matching and that Apply
// then leaves alone; Apply's table in turn lists exactly like the script's; and what Show
// reports is nft syntax too.
func TestScriptAndApplierAgree(t *testing.T) {
	nt.RequireRoot(t)
	for name, c := range nativeCases() {
		t.Run(name, func(t *testing.T) {
			rs := iptablestest.Build(t, c)
			script := iptablestest.NFTScript(rs.NFT())
			viaNFT := nt.NewNS(t)
			gen := generation(t, viaNFT)
			mustRun(t, viaNFT, script, "nft", "-c", "-f", "-")
			if g := generation(t, viaNFT); g != gen {
				t.Errorf("nft -c committed something: generation %d -> %d", gen, g)
			}
			mustRun(t, viaNFT, script, "nft", "-f", "-")
			mustRun(t, viaNFT, script, "nft", "-f", "-") // the script is re-runnable
			if st := showWith(t, viaNFT, nativeApplier(), rs); !st.Match() {
				t.Errorf("show of the nft -f table does not match:\n%s", st.Families[0].Diff)
			}
			gen = generation(t, viaNFT)
			if res := applyWith(t, viaNFT, nativeApplier(), rs); res.Changed {
				t.Error("apply over the identical nft -f table rewrote it")
			}
			if g := generation(t, viaNFT); g != gen {
				t.Errorf("apply over the identical table committed: generation %d -> %d", gen, g)
			}

			viaApplier := nt.NewNS(t)
			applyWith(t, viaApplier, nativeApplier(), rs)
			if a, b := listing(t, viaNFT), listing(t, viaApplier); a != b {
				t.Errorf("nft -f and the applier list differently:\n--- nft -f\n%s\n--- applier\n%s", a, b)
			}
			replayed := nt.NewNS(t)
			st := showWith(t, viaApplier, nativeApplier(), rs)
			mustRun(t, replayed, strings.Join(st.Families[0].Rules, "\n")+"\n", "nft", "-f", "-")
			if st := showWith(t, replayed, nativeApplier(), rs); !st.Match() {
				t.Errorf("show's statements replayed by nft do not match:\n%s", st.Families[0].Diff)
			}
		})
	}
}

// The batch the native writer prints is an nft script: nft -f of what --simulate shows for a
// fresh namespace builds the table the writer builds.
func TestPrintedNativeBatchIsAnNFTScript(t *testing.T) {
	nt.RequireRoot(t)
	for name, c := range nativeCases() {
		t.Run(name, func(t *testing.T) {
			rs := iptablestest.Build(t, c)
			viaNFT, viaApplier := nt.NewNS(t), nt.NewNS(t)
			var printed string
			in(t, viaNFT, func() error { printed = nativeApplier().BatchFor(ctx(t), rs).String(); return nil })
			mustRun(t, viaNFT, printed, "nft", "-f", "-")
			applyWith(t, viaApplier, nativeApplier(), rs)
			if a, b := listing(t, viaNFT), listing(t, viaApplier); a != b {
				t.Errorf("nft -f of the printed batch and the applier list differently:\n--- nft -f\n%s\n--- applier\n%s\n--- batch\n%s", a, b, printed)
			}
		})
	}
}

// A config change replaces the table in exactly one transaction.
func TestNativeConfigChangeIsOneTransaction(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	applyWith(t, n, nativeApplier(), build(t, nil))
	gen := generation(t, n)
	next := build(t, func(c *iptables.Config) {
		c.OutboundPortsToIgnore = []string{"443,6443"}
		c.OutboundSubnetsToIgnore = []string{"192.0.2.0/24"}
	})
	if res := applyWith(t, n, nativeApplier(), next); !res.Changed {
		t.Fatal("changed config reported no change")
	}
	if g := generation(t, n); g != gen+1 {
		t.Errorf("config change took %d transactions, want 1", g-gen)
	}
	if st := showWith(t, n, nativeApplier(), next); !st.Match() {
		t.Errorf("after the change:\n%s", st.Families[0].Diff)
	}
	if st := showWith(t, n, nativeApplier(), build(t, nil)); st.Match() {
		t.Error("old config still matches after the change")
	}
}

// A table changed behind our back is rewritten even though its plan comment still matches.
func TestTamperedTableIsRepaired(t *testing.T) {
	nt.RequireRoot(t)
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
			n := nt.NewNS(t)
			// Sets are written constant, and the kernel refuses new elements in a constant set;
			// for the element case, start from the script's table with non-constant sets (same
			// plan comment), which Apply must also replace.
			if strings.Contains(tt.tamper, "element") {
				mustRun(t, n, strings.ReplaceAll(iptablestest.NFTScript(rs.NFT()), "flags constant,interval", "flags interval"), "nft", "-f", "-")
			} else {
				applyWith(t, n, nativeApplier(), rs)
			}
			mustRun(t, n, "", "nft", tt.tamper)
			if st := showWith(t, n, nativeApplier(), rs); st.Match() {
				t.Fatal("show does not see the tampering")
			}
			if res := applyWith(t, n, nativeApplier(), rs); !res.Changed {
				t.Error("apply left the tampered table alone")
			}
			if st := showWith(t, n, nativeApplier(), rs); !st.Match() {
				t.Errorf("after repair:\n%s", st.Families[0].Diff)
			}
		})
	}
}

// iptables-nft chains and jumps of ours, written by the iptables binaries, are removed by a
// native apply in the same transaction; other rules in the nat tables stay. An applier covering
// iptables-nft alone, as the runner uses one after the binaries wrote elsewhere, lists and
// removes them and leaves the native table alone.
func TestNativeApplyRemovesIptablesNFTRules(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	rs := build(t, nil)
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		restore := map[iptables.Family]string{iptables.IPv4: "iptables-nft-restore", iptables.IPv6: "ip6tables-nft-restore"}[f]
		mustRun(t, n, iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f)), restore, "--noflush")
		mustRun(t, n, "*nat\n-A OUTPUT -p udp --dport 53 -j ACCEPT\nCOMMIT\n", restore, "--noflush")
	}
	gen := generation(t, n)
	if res := applyWith(t, n, nativeApplier(), rs); !res.Changed {
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
	if st := showWith(t, n, nativeApplier(), rs); !st.Match() {
		t.Errorf("show after switching:\n%s", st.Families[0].Diff)
	}

	mustRun(t, n, iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(iptables.IPv4)), "iptables-nft-restore", "--noflush")
	x := New(iptables.BackendNFT)
	var present []iptables.Elsewhere
	in(t, n, func() (err error) {
		present, err = x.Present(ctx(t))
		return err
	})
	if len(present) != 1 || present[0].Backend != iptables.BackendNFT {
		t.Fatalf("present: %+v, want iptables-nft's rules alone", present)
	}
	got := strings.Join(present[0].Rules, "\n")
	for _, w := range []string{"ipv4: chain PROXY_INIT_OUTPUT", "ipv4: chain PROXY_INIT_REDIRECT", "ipv4: -A PREROUTING -m comment", "ipv4: -A OUTPUT -m comment"} {
		if !strings.Contains(got, w) {
			t.Errorf("the iptables-nft rules listed lack %q:\n%s", w, got)
		}
	}
	in(t, n, func() error { return x.Cleanup(ctx(t)) })
	if out := mustRun(t, n, "", "iptables-nft-save", "-t", "nat"); strings.Contains(out, "PROXY_INIT") {
		t.Errorf("iptables-nft rules left:\n%s", out)
	}
	if st := showWith(t, n, nativeApplier(), rs); !st.Match() {
		t.Errorf("our table was touched:\n%s", st.Families[0].Diff)
	}
}

// With no binaries on PATH the writers still work: they never exec.
func TestWorksWithEmptyPATH(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	t.Setenv("PATH", "")
	if _, err := exec.LookPath("nft"); err == nil {
		t.Fatal("nft still found with an empty PATH")
	}
	rs := build(t, nil)
	for _, a := range []*Applier{nativeApplier(), New(iptables.BackendNFT, iptables.BackendNFTables)} {
		in(t, n, func() error {
			if _, err := a.Apply(ctx(t), rs); err != nil {
				return err
			}
			st, err := a.Show(ctx(t), rs)
			if err != nil {
				return err
			}
			if !st.Match() {
				return fmt.Errorf("%s show: %+v", a.Name(), st)
			}
			return a.Cleanup(ctx(t))
		})
		var left []iptables.Elsewhere
		in(t, n, func() (err error) {
			left, err = a.Present(ctx(t))
			return err
		})
		if len(left) > 0 {
			t.Errorf("%s left rules of ours after cleanup: %+v", a.Name(), left)
		}
	}
}

// A batch the kernel refuses writes nothing: the table in place stays as it was, and the error
// names the refused message.
func TestRefusedBatchWritesNothing(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	old := build(t, nil)
	applyWith(t, n, nativeApplier(), old)
	gen, handle := generation(t, n), ourTable(t, n).handle

	bad := build(t, func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"443"} }).NFT()
	// A comment longer than the kernel's user data limit (256 bytes) on the last rule.
	out := &bad.Chains[1]
	out.Rules[len(out.Rules)-1].Comment = strings.Repeat("x", 300)
	var err error
	in(t, n, func() error {
		c, err0 := dial(ctx(t))
		if err0 != nil {
			return err0
		}
		defer c.close()
		s, err0 := read(c, func(*State) detail { return detail{} })
		if err0 != nil {
			return err0
		}
		b := newBatch(s)
		s.removeNative(b)
		addNativeTable(b, bad)
		err = c.commit(b)
		return nil
	})
	var be *BatchError
	if !errors.As(err, &be) || !strings.HasPrefix(be.What, "add rule inet proxy_init PROXY_INIT_OUTPUT meta l4proto tcp redirect to :4140") ||
		be.Index != be.Count {
		t.Fatalf("want a BatchError naming the redirect rule, the last message, got %v", err)
	}
	if g := generation(t, n); g != gen {
		t.Errorf("refused batch committed: generation %d -> %d", gen, g)
	}
	if ti := ourTable(t, n); ti == nil || ti.handle != handle || ti.comment != old.NFTComment() {
		t.Errorf("table changed by a refused batch: %+v", ti)
	}
	if st := showWith(t, n, nativeApplier(), old); !st.Match() {
		t.Errorf("old rules damaged:\n%s", st.Families[0].Diff)
	}

	// A nil ruleset, or one that did not come from Build (a zero proxy port), is refused before
	// anything is sent.
	in(t, n, func() error {
		if _, err := nativeApplier().Apply(ctx(t), nil); err == nil {
			return errors.New("apply of a nil ruleset succeeded")
		}
		_, err := nativeApplier().Apply(ctx(t), &iptables.Ruleset{Families: []iptables.Family{iptables.IPv4}, ProxyUID: -1, ProxyGID: -1})
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
	nt.RequireRoot(t)
	n := nt.NewNS(t)
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
	applyWith(t, n, nativeApplier(), rs)
	if g := generation(t, n); g != gen+1 {
		t.Errorf("large apply took %d transactions, want 1", g-gen)
	}
	if st := showWith(t, n, nativeApplier(), rs); !st.Match() {
		t.Errorf("large table does not read back:\n%s", st.Families[0].Diff)
	}
	out := mustRun(t, n, "", "nft", "list", "set", "inet", iptables.NFTTableName, "outbound_ignore_subnets_v6")
	if c := strings.Count(out, "::/48"); c != 1000 {
		t.Errorf("nft lists %d v6 elements, want 1000", c)
	}
}

// Concurrent applies of different plans in one namespace, as many as an apply makes attempts, all
// succeed (the kernel serializes the batches, and a batch planned from a state another overtook
// is planned again: each round, one of them commits) and leave exactly one of the two plans.
func TestConcurrentApplies(t *testing.T) {
	nt.RequireRoot(t)
	for _, backend := range []iptables.Backend{iptables.BackendNFTables, iptables.BackendNFT} {
		t.Run(string(backend), func(t *testing.T) {
			n := nt.NewNS(t)
			a := build(t, nil)
			b := build(t, func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"443,6443"} })
			errs := make(chan error, attempts)
			for i := range attempts {
				go func() {
					rs := a
					if i%2 == 1 {
						rs = b
					}
					errs <- n.Do(func() error {
						_, err := New(backend, iptables.BackendNFT, iptables.BackendNFTables).Apply(ctx(t), rs)
						return err
					})
				}()
			}
			for range attempts {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
			w := New(backend)
			if showWith(t, n, w, a).Match() == showWith(t, n, w, b).Match() {
				t.Errorf("want exactly one plan in place:\n%s", mustRun(t, n, "", "nft", "list", "ruleset"))
			}
		})
	}
}

// A batch planned from a read that another writer overtook is refused whole (the kernel checks
// the generation it names), so Apply plans again instead of acting on a stale read.
func TestStalePlanRefused(t *testing.T) {
	nt.RequireRoot(t)
	for _, backend := range []iptables.Backend{iptables.BackendNFT, iptables.BackendNFTables} {
		t.Run(string(backend), func(t *testing.T) {
			n := nt.NewNS(t)
			rs := build(t, nil)
			a := New(backend, iptables.BackendNFT, iptables.BackendNFTables)
			var err error
			in(t, n, func() error {
				c, err0 := dial(ctx(t))
				if err0 != nil {
					return err0
				}
				defer c.close()
				s, err0 := read(c, a.want(rs))
				if err0 != nil {
					return err0
				}
				b := a.batch(s, rs)
				// Another writer, between our read and our write.
				mustRun(t, n, "", "nft", "add table inet other")
				err = c.commit(b)
				return nil
			})
			var be *BatchError
			if !errors.As(err, &be) || !errors.Is(be.Err, unix.ERESTART) || be.Index != 0 || !stale(err) {
				t.Fatalf("commit of a stale plan: %v; want ERESTART for the whole batch", err)
			}
			if out := mustRun(t, n, "", "nft", "list", "tables"); out != "table inet other\n" {
				t.Errorf("the refused transaction wrote something:\n%s", out)
			}
			// Apply itself reads again and writes.
			if res := applyWith(t, n, a, rs); !res.Changed {
				t.Errorf("apply after another writer: %+v", res)
			}
			if st := showWith(t, n, a, rs); !st.Match() {
				t.Errorf("show after the apply: %+v", st)
			}
		})
	}
}
