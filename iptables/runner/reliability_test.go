package runner_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// writerModes are the modes that write rules somewhere different.
var writerModes = []iptables.Mode{iptables.ModeLegacy, iptables.ModeNFT, iptables.ModeNFTables}

// residueTools are the tools residue runs, found when the package loads, so that a test that
// empties PATH (to prove a mode runs no program) can still look.
var residueTools = func() map[string]string {
	m := map[string]string{}
	for _, name := range []string{"iptables-legacy-save", "ip6tables-legacy-save", "iptables-nft-save", "ip6tables-nft-save", "nft"} {
		m[name] = name
		if p, err := exec.LookPath(name); err == nil {
			m[name] = p
		}
	}
	return m
}()

// residue reports, with each backend's own tool, anything of ours left in the namespace, in
// every table, and any policy routing of ours.
func residue(t *testing.T, n *nt.NS) string {
	t.Helper()
	out := policyRouting(t, n)
	for _, cmd := range [][]string{
		{"iptables-legacy-save"}, {"ip6tables-legacy-save"},
		{"iptables-nft-save"}, {"ip6tables-nft-save"},
		{"nft", "list", "ruleset"},
	} {
		got, err := nt.RunIn(t, n, residueTools[cmd[0]], cmd[1:]...)
		if err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(cmd, " "), err, got)
		}
		for _, l := range strings.Split(got, "\n") {
			if strings.Contains(l, "PROXY_INIT") || strings.Contains(l, "proxy_init") || strings.Contains(l, "proxy-init/") {
				out = append(out, cmd[0]+": "+strings.TrimSpace(l))
			}
		}
	}
	return strings.Join(out, "\n")
}

// Cleanup removes our rules from every backend, whatever mode it is asked with: rules written
// by iptables-nft used to survive a cleanup in auto or nftables mode, which reported success.
func TestCleanupRemovesEveryBackend(t *testing.T) {
	for _, wrote := range writerModes {
		for _, mode := range append([]iptables.Mode{iptables.ModeAuto}, writerModes...) {
			t.Run(fmt.Sprintf("%s-written-%s-cleanup", wrote, mode), func(t *testing.T) {
				nt.RequireRoot(t)
				w := &world{Pair: nt.NewPair(t)}
				apply(t, w, wrote, suiteConfig())
				if residue(t, w.Pod) == "" {
					t.Fatalf("nothing of ours after an apply in %s mode: the check cannot see it", wrote)
				}
				cleanup(t, w, mode)
				if left := residue(t, w.Pod); left != "" {
					t.Errorf("left after cleanup:\n%s", left)
				}
			})
		}
	}
}

// Show reports rules of ours that another backend still holds, so an unmeshed pod's CHECK or
// `show` cannot say "rules match" beside them.
func TestShowReportsOtherBackends(t *testing.T) {
	nt.RequireRoot(t)
	w := &world{Pair: nt.NewPair(t)}
	apply(t, w, iptables.ModeNFT, suiteConfig())
	// Write the native table too, behind the runner's back.
	rs := iptablestest.Build(t, suiteConfig())
	if _, err := nt.RunInWithInput(t, w.Pod, iptablestest.NFTScript(rs.NFT()), "nft", "-f", "-"); err != nil {
		t.Fatal(err)
	}
	st := show(t, w, iptables.ModeNFT, suiteConfig())
	if st.Match() || len(st.Elsewhere) != 1 || st.Elsewhere[0].Backend != "nftables" || len(st.Elsewhere[0].Rules) == 0 {
		t.Errorf("show with iptables-nft did not report the nftables table: %+v", st.Elsewhere)
	}
	st = show(t, w, iptables.ModeNFTables, suiteConfig())
	if st.Match() || len(st.Elsewhere) == 0 || st.Elsewhere[0].Backend != "iptables-nft" {
		t.Errorf("show with nftables did not report the iptables-nft chains: %+v", st.Elsewhere)
	}
}

// Concurrent writers in one namespace are serialised: whatever the interleaving, every one
// succeeds and the namespace ends with exactly one complete config, in both families. Without the
// lock, runs failed with "Bad rule", left duplicated jumps, and mixed IPv4 and IPv6 from
// different configs.
func TestConcurrentAppliesEndWithOneConfig(t *testing.T) {
	for _, mode := range writerModes {
		t.Run(string(mode), func(t *testing.T) {
			nt.RequireRoot(t)
			w := &world{Pair: nt.NewPair(t)}
			configs := make([]iptables.Config, 12)
			for i := range configs {
				configs[i] = suiteConfig()
				configs[i].Mode = mode
				configs[i].OutboundPortsToIgnore = []string{fmt.Sprint(5000 + i%3)}
			}
			var wg sync.WaitGroup
			errs := make([]error, len(configs))
			for i, c := range configs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rs, err := iptables.Build(c)
					if err == nil {
						_, err = runner.Runner{}.Apply(context.Background(), target(w, mode), rs)
					}
					errs[i] = err
				}()
			}
			wg.Wait()
			for i, err := range errs {
				if err != nil {
					t.Errorf("writer %d: %v", i, err)
				}
			}
			matched := 0
			for _, c := range configs[:3] {
				if st := show(t, w, mode, c); st.Match() {
					matched++
				}
			}
			if matched != 1 {
				t.Errorf("%d of the 3 distinct configs match the rules in place, want exactly 1", matched)
			}
		})
	}
}

// A /0 subnet is idempotent and reads back as written: iptables-save leaves "-d 0.0.0.0/0" out,
// so every re-apply used to rewrite, and show and CHECK always reported a difference.
func TestZeroPrefixSubnetsAreIdempotent(t *testing.T) {
	for _, mode := range writerModes {
		t.Run(string(mode), func(t *testing.T) {
			nt.RequireRoot(t)
			w := &world{Pair: nt.NewPair(t)}
			c := suiteConfig()
			c.OutboundSubnetsToIgnore = []string{"0.0.0.0/0", "::/0"}
			c.InboundSubnetsToIgnore = []string{"0.0.0.0/0"}
			if out := apply(t, w, mode, c); !out.Changed {
				t.Fatal("first apply wrote nothing")
			}
			if out := apply(t, w, mode, c); out.Changed {
				t.Error("an identical re-apply rewrote the rules")
			}
			if st := show(t, w, mode, c); !st.Match() {
				t.Errorf("show after apply: %+v", st)
			}
		})
	}
}

// One family complete and the other empty is named as a half-applied state where the backend
// writes one transaction per family (legacy), as written without that family where it writes
// both at once (nft, over netlink), and a re-apply completes it.
func TestHalfAppliedIsNamedAndCompleted(t *testing.T) {
	for _, mode := range []iptables.Mode{iptables.ModeLegacy, iptables.ModeNFT} {
		t.Run(string(mode), func(t *testing.T) {
			nt.RequireRoot(t)
			w := &world{Pair: nt.NewPair(t)}
			full := suiteConfig()
			rs, err := iptables.Build(full)
			if err != nil {
				t.Fatal(err)
			}
			// What a kill between the families leaves: IPv4's transaction only.
			restore := "iptables-" + string(mode) + "-restore"
			if _, err := nt.RunInWithInput(t, w.Pod, iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(iptables.IPv4)), restore, "--noflush"); err != nil {
				t.Fatal(err)
			}
			st := show(t, w, mode, full)
			named, other := st.HalfApplied(), st.WrittenWithout()
			want := "half-applied: ipv4 has every rule but ipv6 has none"
			if mode == iptables.ModeNFT {
				named, other = other, named
				want = "ipv4 has every rule but ipv6 has none: no run was cut short"
			}
			if !strings.HasPrefix(named, want) || other != "" {
				t.Errorf("HalfApplied() = %q, WrittenWithout() = %q", st.HalfApplied(), st.WrittenWithout())
			}
			apply(t, w, mode, full)
			if st := show(t, w, mode, full); !st.Match() || st.HalfApplied() != "" {
				t.Errorf("a re-apply did not complete it: %+v", st)
			}
		})
	}
}

// A program started under the lock inherits it: a writer killed while its iptables-restore runs
// leaves the namespace locked until that restore exits, so the next writer never reads a state
// the orphan is still changing.
func TestLockIsInheritedByChildren(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	unlock, err := runner.Lock(n.Path(), true, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "1")
	if err := child.Start(); err != nil {
		unlock()
		t.Fatal(err)
	}
	unlock() // as if the writer were killed: only the child holds the lock now
	if _, err := runner.Lock(n.Path(), true, 100*time.Millisecond); err == nil || !strings.Contains(err.Error(), "still writing rules") {
		t.Errorf("took the lock while the child holds it: %v", err)
	}
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
	again, err := runner.Lock(n.Path(), true, time.Second)
	if err != nil {
		t.Fatalf("lock still held after the child exited: %v", err)
	}
	again()
}
