package proxyinit

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/internal/buildinfo"
	"github.com/kubemesh/proxy-init/iptables"
)

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
			var stdout, stderr bytes.Buffer
			if code := Main(context.Background(), tt.args, &stdout, &stderr); code != ExitOK {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			o, err := Parse(tt.args)
			if err != nil {
				t.Fatal(err)
			}
			rs, err := iptables.Build(o.Config)
			if err != nil {
				t.Fatal(err)
			}
			out := stdout.String()
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

func TestSimulateCloseWaitAndCleanup(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), chartArgs("--simulate", "--timeout-close-wait-secs", "120"), &stdout, &stderr); code != ExitOK {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "# and write 120 to "+iptables.CloseWaitSysctl) {
		t.Errorf("simulate does not mention the sysctl:\n%s", stdout.String())
	}
}

// cleanup --simulate shows, per mode, what removes the rules an apply wrote, rendered from the
// plan like everything else.
func TestSimulateCleanup(t *testing.T) {
	tests := []struct {
		mode        string
		want, avoid []string
	}{
		{"nftables", []string{"delete table inet proxy_init\n"}, []string{"-X PROXY_INIT"}},
		{"nft", []string{
			"# ipv4: iptables-restore --noflush\n*nat\n:PROXY_INIT_REDIRECT - [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n" +
				"-D PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT\n" +
				"-D OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" -j PROXY_INIT_OUTPUT\n" +
				"-X PROXY_INIT_REDIRECT\n-X PROXY_INIT_OUTPUT\nCOMMIT\n",
			"# ipv6: ip6tables-restore --noflush\n"}, []string{"delete table"}},
		{"auto", []string{"delete table inet proxy_init\n", "-X PROXY_INIT_OUTPUT\n", "any other backend"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if code := Main(context.Background(), []string{"cleanup", "--simulate", "--iptables-mode", tt.mode}, &stdout, &stderr); code != ExitOK {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			for _, w := range tt.want {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, stdout.String())
				}
			}
			for _, a := range tt.avoid {
				if strings.Contains(stdout.String(), a) {
					t.Errorf("output has %q:\n%s", a, stdout.String())
				}
			}
		})
	}
}

func TestSimulateNFTables(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), chartArgs("--simulate", "--iptables-mode", "nftables"), &stdout, &stderr)
	rs, err := iptables.Build(cfg(nil))
	if err != nil {
		t.Fatal(err)
	}
	if code != ExitOK || !strings.Contains(stdout.String(), rs.NFTScript()) || strings.Contains(stdout.String(), "*nat") {
		t.Errorf("exit %d, want the nft script and no restore payload:\n%s%s", code, stdout.String(), stderr.String())
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

// TestIgnoreSignals shows that a SIGTERM arriving while rules are written does not stop
// proxy-init. It runs in a child process: the disposition cannot be undone.
func TestIgnoreSignals(t *testing.T) {
	if os.Getenv("PROXY_INIT_TEST_SIGNALS") == "1" {
		ignoreSignals()
		if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
		return // reached only if the signal did not end the process
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestIgnoreSignals$")
	cmd.Env = append(os.Environ(), "PROXY_INIT_TEST_SIGNALS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the child died of the SIGTERM it should have ignored: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "PASS") {
		t.Fatalf("the child did not report a pass:\n%s", out)
	}
}
