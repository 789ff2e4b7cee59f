package xtables_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/xtables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

func requireRoot(t *testing.T) { netnstest.RequireRoot(t) }

func newNS(t *testing.T) *netnstest.NS { return netnstest.NewNS(t) }

func chartConfig() iptables.Config {
	c := iptablestest.ChartConfig()
	c.InboundSubnetsToIgnore = []string{"198.51.100.0/24", "2001:db8:1::/48"}
	return c
}

func save(t *testing.T, n *netnstest.NS, bin string) string {
	t.Helper()
	out, _ := netnstest.Output(t, n, "", bin, "-t", "nat")
	// Drop the timestamped comment lines and counters so runs compare.
	var keep []string
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "#") {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

func do(t *testing.T, n *netnstest.NS, fn func() error) error {
	t.Helper()
	return n.Do(fn)
}

func TestApplyIdempotentChangeCleanup(t *testing.T) {
	requireRoot(t)
	for _, mode := range []iptables.Mode{iptables.ModeLegacy, iptables.ModeNFT} {
		t.Run(string(mode), func(t *testing.T) {
			ctx := context.Background()
			n := newNS(t)
			a, err := xtables.New(mode, xtables.Options{Wait: true})
			if err != nil {
				t.Fatal(err)
			}
			saveBin := map[iptables.Mode]string{iptables.ModeLegacy: "iptables-legacy-save", iptables.ModeNFT: "iptables-nft-save"}[mode]
			save6 := "ip6" + strings.TrimPrefix(saveBin, "ip")
			rs, err := iptables.Build(chartConfig())
			if err != nil {
				t.Fatal(err)
			}
			var res iptables.Result
			if err := do(t, n, func() (err error) { res, err = a.Apply(ctx, rs); return }); err != nil {
				t.Fatal(err)
			}
			if !res.Changed {
				t.Fatal("first apply reported no change")
			}
			first4, first6 := save(t, n, saveBin), save(t, n, save6)
			for _, rl := range rs.Saved(iptables.IPv4).Rules {
				if !strings.Contains(first4, rl) {
					t.Errorf("ipv4 save lacks %q:\n%s", rl, first4)
				}
			}
			if strings.Contains(first6, "198.51.100.0/24") || !strings.Contains(first6, "2001:db8:1::/48") {
				t.Errorf("ipv6 rules carry the wrong subnets:\n%s", first6)
			}

			if err := do(t, n, func() (err error) { res, err = a.Apply(ctx, rs); return }); err != nil {
				t.Fatal(err)
			}
			if res.Changed {
				t.Error("identical re-run reported a change")
			}
			if s4, s6 := save(t, n, saveBin), save(t, n, save6); s4 != first4 || s6 != first6 {
				t.Errorf("re-run changed the rules:\n%s\nwas\n%s", s4, first4)
			}

			// A new config replaces the chains' content and keeps single jumps.
			c := chartConfig()
			c.OutboundPortsToIgnore = []string{"443,6443"}
			rs2, _ := iptables.Build(c)
			if err := do(t, n, func() (err error) { _, err = a.Apply(ctx, rs2); return }); err != nil {
				t.Fatal(err)
			}
			var st iptables.State
			if err := do(t, n, func() (err error) { st, err = a.Show(ctx, rs2); return }); err != nil {
				t.Fatal(err)
			}
			if !st.Match() {
				t.Errorf("after a config change the rules differ: %+v", st)
			}
			if s := save(t, n, saveBin); strings.Contains(s, "proxy-init/ignore-port-4567,4568\"") || strings.Count(s, "-j PROXY_INIT_OUTPUT") != 1 {
				t.Errorf("old rules survived the change or jumps duplicated:\n%s", s)
			}

			if err := do(t, n, func() error { return a.Cleanup(ctx) }); err != nil {
				t.Fatal(err)
			}
			for _, b := range []string{saveBin, save6} {
				if s := save(t, n, b); strings.Contains(s, "PROXY_INIT") {
					t.Errorf("%s after cleanup still shows our chains:\n%s", b, s)
				}
			}
			if err := do(t, n, func() error { return a.Cleanup(ctx) }); err != nil {
				t.Errorf("second cleanup: %v", err)
			}
		})
	}
}

// TestIPv6FailureRollsBackIPv4 makes ip6tables-restore fail after IPv4 succeeded, and checks
// that IPv4 is returned to the rules it had before, so the pod is never half meshed.
func TestIPv6FailureRollsBackIPv4(t *testing.T) {
	requireRoot(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		mode  iptables.Mode
		prior bool
	}{
		{"legacy from empty", iptables.ModeLegacy, false}, {"legacy from previous rules", iptables.ModeLegacy, true},
		// nft restores both families at once: IPv4 may finish first or last, and is undone either way.
		{"nft from empty", iptables.ModeNFT, false}, {"nft from previous rules", iptables.ModeNFT, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			flavor := string(tc.mode)
			n := newNS(t)
			good, err := xtables.New(tc.mode, xtables.Options{})
			if err != nil {
				t.Fatal(err)
			}
			old, _ := iptables.Build(chartConfig())
			if tc.prior {
				if err := do(t, n, func() (err error) { _, err = good.Apply(ctx, old); return }); err != nil {
					t.Fatal(err)
				}
			}
			before := save(t, n, "iptables-"+flavor+"-save")

			// A PATH where ip6tables-<flavor>-restore always fails.
			dir := t.TempDir()
			for _, b := range []string{"iptables-" + flavor + "-restore", "iptables-" + flavor + "-save", "ip6tables-" + flavor + "-save"} {
				real, err := exec.LookPath(b)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.Symlink(real, filepath.Join(dir, b)); err != nil {
					t.Fatal(err)
				}
			}
			fail := "#!/bin/sh\necho 'ip6tables-restore: line 3 failed' >&2\nexit 1\n"
			if err := os.WriteFile(filepath.Join(dir, "ip6tables-"+flavor+"-restore"), []byte(fail), 0o755); err != nil {
				t.Fatal(err)
			}
			t.Setenv("PATH", dir)
			bad, err := xtables.New(tc.mode, xtables.Options{})
			if err != nil {
				t.Fatal(err)
			}
			c := chartConfig()
			c.OutboundSubnetsToIgnore = []string{"203.0.113.0/24", "2001:db8:2::/48"}
			rs, _ := iptables.Build(c)
			err = do(t, n, func() (err error) { _, err = bad.Apply(ctx, rs); return })
			if err == nil {
				t.Fatalf("apply succeeded with a failing ip6tables-%s-restore", flavor)
			}
			if !strings.Contains(err.Error(), "ipv6") || !strings.Contains(err.Error(), "payload line 3: :PROXY_INIT_OUTPUT - [0:0]") {
				t.Errorf("error does not name the family and quote the payload line: %v", err)
			}
			if !strings.Contains(err.Error(), "rolled back") {
				t.Errorf("error does not say IPv4 was rolled back: %v", err)
			}
			if after := save(t, n, "iptables-"+flavor+"-save"); after != before {
				t.Errorf("ipv4 not restored:\n%s\nwant\n%s", after, before)
			}
		})
	}
}

func TestRestoreErrorQuotesPayload(t *testing.T) {
	payload := "*nat\n-A X -j BOGUS\n-A Y -j RETURN\nCOMMIT\n"
	for _, tt := range []struct{ output, want string }{
		{"iptables-nft-restore v1.8.9 (nf_tables): Chain 'BOGUS' does not exist\nError occurred at line: 2", "payload line 2: -A X -j BOGUS"},
		{"iptables-restore: line 3 failed", "payload line 3: -A Y -j RETURN"},
	} {
		e := &xtables.RestoreError{Binary: "iptables-restore", Family: iptables.IPv4, Output: tt.output, Payload: payload, Err: os.ErrInvalid}
		if !strings.Contains(e.Error(), tt.want) {
			t.Errorf("error %q lacks %q", e.Error(), tt.want)
		}
	}
	// A number outside the payload, or none at all, quotes nothing.
	for _, out := range []string{"Error occurred at line: 99", "offline", "line: x"} {
		e := &xtables.RestoreError{Binary: "iptables-restore", Family: iptables.IPv4, Output: out, Payload: payload, Err: os.ErrInvalid}
		if strings.Contains(e.Error(), "payload line") {
			t.Errorf("output %q: error quotes a line: %q", out, e.Error())
		}
	}
}

// TestFallbackWithinBackend: a host with only plain, nf_tables-backed iptables binaries still
// serves nft mode, and refuses legacy mode with a message naming what is missing.
func TestFallbackWithinBackend(t *testing.T) {
	dir := t.TempDir()
	for _, cmd := range []string{"iptables", "ip6tables"} {
		for _, suffix := range []string{"", "-restore", "-save"} {
			real, err := exec.LookPath(cmd + "-nft" + suffix)
			if err != nil {
				t.Fatalf("needs the iptables package (make deps)'s %s-nft%s: %v", cmd, suffix, err)
			}
			if err := os.Symlink(real, filepath.Join(dir, cmd+suffix)); err != nil {
				t.Fatal(err)
			}
		}
	}
	t.Setenv("PATH", dir)
	a, err := xtables.New(iptables.ModeNFT, xtables.Options{})
	if err != nil {
		t.Fatalf("nft mode with nf_tables-backed plain binaries: %v", err)
	}
	if c := a.Covers(); len(c) != 1 || c[0] != iptables.BackendNFT {
		t.Errorf("nf_tables-backed binaries write %v, want iptables-nft's rules", c)
	}
	_, err = xtables.New(iptables.ModeLegacy, xtables.Options{})
	want := "iptables-legacy-restore and iptables-legacy-save not found in PATH (" + dir + "), nor a plain iptables that is iptables-legacy to fall back on"
	if err == nil || err.Error() != want {
		t.Errorf("legacy mode without legacy binaries: got %v, want %q", err, want)
	}
}

// This kernel has the legacy ip_tables and ip6_tables, so a fresh namespace (whose table lists in
// /proc are empty, not absent) is not taken for one without them, and asking creates no table.
// (A kernel without them is stood in for in proxyinit's TestLegacyWithoutKernelSupport.)
func TestLegacyMissingOnAKernelWithIt(t *testing.T) {
	netnstest.RequireRoot(t)
	n := netnstest.NewNS(t)
	if err := n.Do(func() error {
		for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
			if err := xtables.LegacyMissing(f); err != nil {
				t.Errorf("%s: %v", f, err)
			}
			if got := xtables.LegacyTables(f); len(got) != 0 {
				t.Errorf("%s: asking created the tables %v", f, got)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
