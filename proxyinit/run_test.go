package proxyinit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"

	"github.com/kubemesh/proxy-init/internal/buildinfo"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current output")

// simulateMain runs proxy-init with a Runner that cannot enter a namespace, so --simulate plans
// for a namespace holding nothing, as it does without privileges, whoever runs the test.
func simulateMain(t *testing.T, args ...string) string {
	t.Helper()
	r := runner.Runner{Enter: func(runner.Target, bool, func() error) error {
		return errors.New("a unit test enters no namespace")
	}}
	var stdout, stderr bytes.Buffer
	if code := run(context.Background(), args, &stdout, &stderr, r); code != ExitOK {
		t.Fatalf("proxy-init %q: exit %d: %s", args, code, stderr.String())
	}
	return stdout.String()
}

func TestSimulatePrintsExactPayloads(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		families []iptables.Family
	}{
		{"dual stack", chartArgs("--simulate"), []iptables.Family{iptables.IPv4, iptables.IPv6}},
		{"IPv6 off, legacy chart paths", chartArgs("--simulate", "--ipv6=false", "--firewall-bin-path", "iptables-legacy"), []iptables.Family{iptables.IPv4}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := simulateMain(t, tt.args...)
			o, err := Parse(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			rs, err := iptables.Build(o.Config)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
				label := "# " + string(f) + ": "
				want := slicesContains(tt.families, f)
				if strings.Contains(out, label) != want {
					t.Errorf("output has %s label = %v, want %v:\n%s", f, !want, want, out)
				}
				if !want {
					continue
				}
				payload := iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f))
				_, after, _ := strings.Cut(out, label)
				_, after, _ = strings.Cut(after, "\n")
				if !strings.HasPrefix(after, payload) {
					t.Errorf("%s payload after its label is not TransitionPayload from empty:\n got %q\nwant prefix %q", f, after, payload)
				}
			}
		})
	}
}

func slicesContains(fs []iptables.Family, f iptables.Family) bool {
	for _, g := range fs {
		if g == f {
			return true
		}
	}
	return false
}

// TestSimulateCloseWait: --simulate says how apply sets the close-wait timeout, over netlink
// first and through the sysctl file only where the kernel refuses, not as a plain file write.
func TestSimulateCloseWait(t *testing.T) {
	out := simulateMain(t, chartArgs("--simulate", "--timeout-close-wait-secs", "120")...)
	want := "# and set the namespace's conntrack close-wait timeout to 120 s over netlink (cttimeout),\n" +
		"# or, where the kernel refuses that, write 120 to " + iptables.CloseWaitSysctl + "\n"
	if !strings.Contains(out, want) {
		t.Errorf("simulate does not say how the close-wait timeout is set; want\n%s\nin:\n%s", want, out)
	}
}

// cleanup --simulate shows, per mode, what removes our rules: for the iptables binaries the
// restore payload that removes what an apply wrote, for the netlink modes the batch for the state
// in place, here a namespace holding nothing.
func TestSimulateCleanup(t *testing.T) {
	tests := []struct {
		mode        string
		want, avoid []string
	}{
		{"nftables", []string{"# nf_tables: nothing to send, planned for a namespace holding no nf_tables tables"}, []string{"-X PROXY_INIT", "*nat"}},
		{"legacy", []string{
			"# ipv4: iptables-restore --noflush\n*nat\n:PROXY_INIT_REDIRECT - [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n" +
				"-D PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT\n" +
				"-D OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" -j PROXY_INIT_OUTPUT\n" +
				"-X PROXY_INIT_REDIRECT\n-X PROXY_INIT_OUTPUT\nCOMMIT\n",
			"# ipv6: ip6tables-restore --noflush\n"}, []string{"nf_tables"}},
		{"auto", []string{"# nf_tables: nothing to send", "-X PROXY_INIT_OUTPUT\n", "any other backend"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			out := simulateMain(t, "cleanup", "--simulate", "--iptables-mode", tt.mode)
			for _, w := range tt.want {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			for _, a := range tt.avoid {
				if strings.Contains(out, a) {
					t.Errorf("output has %q:\n%s", a, out)
				}
			}
		})
	}
}

// --simulate in the netlink modes prints the batch that would be sent, one message a line; the
// golden files hold it for the Linkerd chart's command line and a namespace holding nothing.
// (go test ./proxyinit -update rewrites them.)
func TestSimulateGolden(t *testing.T) {
	for _, mode := range []string{"nft", "nftables", "auto"} {
		t.Run(mode, func(t *testing.T) {
			got := simulateMain(t, chartArgs("--simulate", "--iptables-mode", mode)...)
			path := filepath.Join("testdata", "simulate-"+mode+".txt")
			iptablestest.CheckGolden(t, path, got, *update, "proxyinit")
		})
	}
}

func TestVersion(t *testing.T) {
	old := buildinfo.Version
	t.Cleanup(func() { buildinfo.Version = old })
	buildinfo.Version = "v1.2.3-test"

	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), append([]string{"version"}, chartArgs()...), &stdout, &stderr); code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.HasPrefix(stdout.String(), "proxy-init v1.2.3-test (") {
		t.Errorf("version output %q", stdout.String())
	}
	stdout.Reset()
	if code := Main(context.Background(), []string{"version", "--output", "json"}, &stdout, &stderr); code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	var info buildinfo.Info
	if err := json.Unmarshal(stdout.Bytes(), &info); err != nil || info.Version != "v1.2.3-test" || info.GoVersion == "" {
		t.Errorf("version JSON %q: %+v, %v", stdout.String(), info, err)
	}
}

func TestShowReport(t *testing.T) {
	rs, err := iptables.Build(cfg(func(c *iptables.Config) { c.IPv6 = false }))
	if err != nil {
		t.Fatal(err)
	}
	saved := rs.Saved(iptables.IPv4)
	missing := saved.Rules[len(saved.Rules)-1]
	partial := iptables.SavedState{Chains: saved.Chains, Rules: saved.Rules[:len(saved.Rules)-1]}
	st := iptables.State{Backend: "iptables-test", Families: []iptables.FamilyState{
		{Family: iptables.IPv4, Rules: partial.Rules, Diff: rs.Compare(iptables.IPv4, partial)},
		{Family: iptables.IPv6},
	}}
	rep := NewShowReport(st, rs)
	if rep.Match || rep.Families[0].Match || !rep.Families[1].Match {
		t.Fatalf("report %+v: want ipv4 mismatching, ipv6 matching", rep)
	}
	var b strings.Builder
	if err := rep.WriteText(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"backend: iptables-test\n", "ipv4 (expected): 6 lines in place, DO NOT MATCH\n", "  missing: " + missing + "\n",
		"ipv6 (none expected): 0 lines in place, match\n", "rules do NOT match the configuration\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, b.String())
		}
	}
	js, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var back ShowReport
	if err := json.Unmarshal(js, &back); err != nil || back.Families[0].Missing[0] != missing || back.Families[1].Rules == nil {
		t.Errorf("JSON round trip %s: %+v %v", js, back, err)
	}
}

// Main changes nothing for the whole process: the settings of a one-shot run (no garbage
// collection, SIGINT and SIGTERM ignored) are cmd/proxy-init's, whose tests show the binary
// ignoring the signals while it writes.
func TestMainLeavesTheProcessAlone(t *testing.T) {
	gc := debug.SetGCPercent(-1)
	debug.SetGCPercent(gc)
	limit := debug.SetMemoryLimit(-1)
	for _, args := range [][]string{chartArgs("--simulate"), {"cleanup", "--simulate"}, {"version"}} {
		simulateMain(t, args...)
	}
	if now := debug.SetGCPercent(gc); now != gc {
		t.Errorf("Main changed the GC percentage from %d to %d", gc, now)
	}
	if now := debug.SetMemoryLimit(-1); now != limit {
		t.Errorf("Main changed the memory limit from %d to %d", limit, now)
	}
	for _, sig := range []os.Signal{os.Interrupt, syscall.SIGTERM} {
		if signal.Ignored(sig) {
			t.Errorf("Main made the process ignore %v", sig)
		}
	}
	if !OneShot(nil) || !OneShot(chartArgs()) || !OneShot([]string{"cleanup"}) || OneShot([]string{"validate", "--timeout", "1s"}) {
		t.Error("OneShot: every command but validate is a one-shot run")
	}
}

// In its pod proxy-init takes the in-pod lock alone; with --netns, on a node that has the host
// locks' directory, the host lock first and then the in-pod one.
func TestTargetLocks(t *testing.T) {
	present := t.TempDir()
	tests := []struct {
		name, netns, dir string
		host             string
		inPod            bool
	}{
		{"in its pod", "", present, "", false},
		{"--netns on a node with linkerd-cni", "/run/netns/pod", present, present, true},
		{"--netns on a node without it", "/run/netns/pod", filepath.Join(present, "none"), "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func(d string) { hostLockDir = d }(hostLockDir)
			hostLockDir = tt.dir
			o := &Options{NetNS: tt.netns}
			got := o.target(slog.New(slog.DiscardHandler))
			if got.HostLockDir != tt.host || got.InPodLock != tt.inPod {
				t.Errorf("host lock %q, in-pod %v; want %q, %v", got.HostLockDir, got.InPodLock, tt.host, tt.inPod)
			}
		})
	}
}
