package validator_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
	"github.com/kubemesh/proxy-init/validator"
)

// The validator is run as a child process (this test binary, re-executed) started from inside
// the pod namespace, exactly as the init container runs: every socket it opens, on whatever
// thread, is then in the pod namespace, and its exit code is the real one.
func TestMain(m *testing.M) {
	nt.ChildMain(func() int {
		return validator.Main(context.Background(), os.Args[1:], io.Discard, os.Stderr)
	})
	os.Exit(m.Run())
}

// Documentation addresses nothing answers: routed from the pod via the peer, which does not own
// them and does not forward.
const (
	connectV4 = "203.0.113.99:20001"
	connectV6 = "[2001:db8:2::99]:20001"
	proxyUID  = 2102
)

// runAs says who the validator child runs as.
type runAs struct {
	uid int // 0: root
}

// asNobody is the init container's user, with no capabilities.
var asNobody = runAs{65534}

// validate runs the validator in n and returns its exit code and log.
func validate(t *testing.T, n *nt.NS, who runAs, args ...string) (int, string) {
	t.Helper()
	bin := selfBinary(t, who)
	env := append(os.Environ(), nt.ChildEnv(t, n.Path()))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out []byte
	var runErr error
	if err := n.Do(func() error {
		cmd := exec.CommandContext(ctx, bin, args...)
		cmd.Env = env
		if who.uid != 0 {
			// Changing from root to another UID at exec clears every capability.
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(who.uid), Gid: uint32(who.uid)}}
		}
		out, runErr = cmd.CombinedOutput()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var ee *exec.ExitError
	switch {
	case runErr == nil:
		return 0, string(out)
	case errors.As(runErr, &ee):
		if ee.ExitCode() == nt.ChildRefused {
			t.Fatalf("validator child refused to run: %s", out)
		}
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("run validator: %v\n%s", runErr, out)
	return 0, ""
}

// selfBinary returns this test binary, or for a non-root user a copy it can execute (go test
// keeps the binary in a directory only root can enter).
func selfBinary(t *testing.T, who runAs) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if who.uid == 0 {
		return self
	}
	dir, err := os.MkdirTemp("", "validator-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(self)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "validator.test")
	if err := os.WriteFile(dst, b, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// ruleConfig is the chart's proxy-init configuration.
func ruleConfig(mode iptables.Mode, ipv6 bool) iptables.Config {
	c := iptablestest.ChartConfig()
	c.Mode, c.IPv6 = mode, ipv6
	return c
}

// applyRules writes the rules into the pod through the backend runner, as proxy-init does.
func applyRules(t *testing.T, pod *nt.NS, c iptables.Config) {
	t.Helper()
	rs, err := iptables.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	out, err := runner.Runner{}.Apply(context.Background(), runner.Target{NetNS: pod.Path(), Options: runner.Options{Mode: c.Mode, Wait: true}}, rs)
	if err != nil {
		t.Fatalf("apply %s rules: %v", c.Mode, err)
	}
	if c.Mode == iptables.ModeNFTables && out.Backend != "nftables" {
		t.Fatalf("mode nftables gave backend %s", out.Backend)
	}
}

// removeOutbound deletes the OUTPUT hook of our rules, leaving the inbound ones in place, and
// checks that it did.
func removeOutbound(t *testing.T, pod *nt.NS, mode iptables.Mode, ipv6 bool) {
	t.Helper()
	run := func(name string, args ...string) string {
		out, err := nt.RunIn(t, pod, name, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	if mode == iptables.ModeNFTables {
		run("nft", "delete", "chain", "inet", iptables.NFTTableName, iptables.OutputChain)
		out := run("nft", "list", "table", "inet", iptables.NFTTableName)
		if strings.Contains(out, iptables.OutputChain) || !strings.Contains(out, iptables.RedirectChain) {
			t.Fatalf("after deleting the output chain:\n%s", out)
		}
		return
	}
	bins := [][2]string{{"iptables-" + string(mode), "iptables-" + string(mode) + "-save"}}
	if ipv6 {
		bins = append(bins, [2]string{"ip6tables-" + string(mode), "ip6tables-" + string(mode) + "-save"})
	}
	for _, b := range bins {
		out, err := nt.RunInWithInput(t, pod, "*nat\n-F OUTPUT\nCOMMIT\n", b[0]+"-restore", "--noflush")
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		saved := run(b[1], "-t", "nat")
		if strings.Contains(saved, "-A OUTPUT") || !hasJump(saved, "PREROUTING", iptables.RedirectChain) || !hasJump(saved, iptables.OutputChain, "REDIRECT") {
			t.Fatalf("%s after removing the OUTPUT jump:\n%s", b[1], saved)
		}
	}
}

// A Service's ClusterIP and the backend a socket-level load balancer would pick for it.
const (
	clusterIP   = "203.0.113.77:443"
	backendAddr = "198.51.100.20:6443"
)

// rewriteBeforeRules rewrites connections to clusterIP into connections to backendAddr before
// conntrack (output priority -300, ahead of its -200), and the replies' source back after NAT has
// put the backend there (input priority 200, after NAT's 100), so the redirected connection's
// original destination is the backend while the socket sees the address it dialled.
func rewriteBeforeRules(t *testing.T, pod *nt.NS) {
	t.Helper()
	ca, cp, _ := strings.Cut(clusterIP, ":")
	ba, bp, _ := strings.Cut(backendAddr, ":")
	script := fmt.Sprintf(`table ip socketlb {
  chain out { type filter hook output priority -300; ip daddr %[1]s tcp dport %[2]s ip daddr set %[3]s tcp dport set %[4]s; }
  chain in { type filter hook input priority 200; ip saddr %[3]s tcp sport %[4]s ip saddr set %[1]s tcp sport set %[2]s; }
}
`, ca, cp, ba, bp)
	if out, err := nt.RunInWithInput(t, pod, script, "nft", "-f", "-"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// hasJump reports whether iptables-save output has a rule in chain jumping to target.
func hasJump(saved, chain, target string) bool {
	for _, l := range strings.Split(saved, "\n") {
		if strings.HasPrefix(l, "-A "+chain+" ") && strings.Contains(l, " -j "+target) {
			return true
		}
	}
	return false
}

// backends are the modes the validator is proven against.
var backends = []iptables.Mode{iptables.ModeLegacy, iptables.ModeNFT, iptables.ModeNFTables}

type outcome struct {
	code int
	// log substrings that must (want) and must not (not) appear.
	want, not []string
}

var passed = "validation passed"

// TestValidatorWithRules runs the validator against proxy-init's rules for every backend.
func TestValidatorWithRules(t *testing.T) {
	nt.RequireRoot(t)
	tests := []struct {
		name string
		ipv6 bool // rules for IPv6 too
		// mutate changes the rules after applying them
		mutate func(t *testing.T, pod *nt.NS, mode iptables.Mode)
		who    runAs
		args   []string
		want   outcome
	}{
		{
			name: "ipv4 passes",
			ipv6: true, args: []string{"--connect-addr", connectV4},
			want: outcome{code: 0, want: []string{passed, "check=ipv4", "original_dst=" + connectV4}, not: []string{"check=ipv6"}},
		},
		{
			name: "ipv6 connect addr passes",
			ipv6: true, args: []string{"--connect-addr", connectV6, "--listen-addr", "[::]:4140"},
			want: outcome{code: 0, want: []string{passed, "check=ipv6", "original_dst=" + connectV6}},
		},
		{
			name: "ipv4 connect addr with a dual-stack listener passes",
			ipv6: true, args: []string{"--connect-addr", connectV4, "--listen-addr", "[::]:4140"},
			want: outcome{code: 0, want: []string{passed, "original_dst=" + connectV4}},
		},
		{
			name: "--ipv6 checks both families",
			ipv6: true, args: []string{"--connect-addr", connectV4, "--ipv6", "--ipv6-connect-addr", connectV6},
			want: outcome{code: 0, want: []string{passed, "check=ipv4", "check=ipv6", "original_dst=" + connectV6}},
		},
		{
			name: "--ipv6 fails when the rules are IPv4 only",
			ipv6: false, args: []string{"--connect-addr", connectV4, "--ipv6", "--ipv6-connect-addr", connectV6, "--timeout", "1s"},
			want: outcome{code: 95, want: []string{"ipv6 check failed (not-redirected)", "outbound TCP to " + connectV6 + " is not redirected"}, not: []string{"ipv4 check failed"}},
		},
		{
			name: "only inbound rules: outbound not redirected",
			ipv6: true, mutate: func(t *testing.T, pod *nt.NS, mode iptables.Mode) { removeOutbound(t, pod, mode, true) },
			args: []string{"--connect-addr", connectV4, "--ipv6", "--ipv6-connect-addr", connectV6, "--timeout", "1s"},
			want: outcome{code: 95, want: []string{"ipv4 check failed (not-redirected)", "ipv6 check failed (not-redirected)", "no connection arrived on 0.0.0.0:4140 within 1s"}},
		},
		{
			name: "the proxy UID is exempt",
			ipv6: true, args: []string{"--connect-addr", connectV4, "--ipv6", "--ipv6-connect-addr", connectV6, "--proxy-uid", strconv.Itoa(proxyUID)},
			want: outcome{code: 0, want: []string{passed, "proxy UID is not redirected", "proxy_uid=2102"}, not: []string{"skipped"}},
		},
		{
			name: "a UID the rules do not exempt is reported",
			ipv6: true, args: []string{"--connect-addr", connectV4, "--ipv6", "--ipv6-connect-addr", connectV6, "--proxy-uid", "2103"},
			want: outcome{code: 95, want: []string{"proxy-uid ipv4 check failed (proxy-uid-redirected)", "proxy-uid ipv6 check failed (proxy-uid-redirected)", "made as the proxy UID 2103 was redirected"}},
		},
		{
			// Cilium's socket-LB turns a ClusterIP into a backend inside connect(), before
			// netfilter sees the packet; a stateless rewrite ahead of conntrack stands in for it
			// (and puts the ClusterIP back on the replies, as the socket expects).
			name: "a destination rewritten before the rules is named, with what to do",
			ipv6: true, mutate: func(t *testing.T, pod *nt.NS, _ iptables.Mode) { rewriteBeforeRules(t, pod) },
			args: []string{"--connect-addr", clusterIP},
			want: outcome{code: 95, want: []string{"ipv4 check failed (destination-rewritten)", "original destination is " + backendAddr + ", not " + clusterIP,
				"socketLB.hostNamespaceOnly=true"}},
		},
		{
			name: "as nobody without capabilities: passes, UID check skipped",
			ipv6: true, who: asNobody,
			args: []string{"--connect-addr", connectV4, "--ipv6", "--ipv6-connect-addr", connectV6, "--proxy-uid", strconv.Itoa(proxyUID)},
			want: outcome{code: 0, want: []string{passed, "proxy UID check skipped", "operation not permitted"}, not: []string{"proxy UID is not redirected"}},
		},
	}
	for _, mode := range backends {
		t.Run(string(mode), func(t *testing.T) {
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					p := nt.NewPair(t)
					applyRules(t, p.Pod, ruleConfig(mode, tc.ipv6))
					if tc.mutate != nil {
						tc.mutate(t, p.Pod, mode)
					}
					code, log := validate(t, p.Pod, tc.who, tc.args...)
					tc.want.check(t, code, log)
				})
			}
		})
	}
}

// TestValidatorWithoutRules covers the failures that need no rules at all.
func TestValidatorWithoutRules(t *testing.T) {
	nt.RequireRoot(t)
	tests := []struct {
		name string
		// server, if set, is started on the peer at this address; podServer in the pod
		server, podServer string
		who               runAs
		args              []string
		want              outcome
		minTime           time.Duration
	}{
		{
			name: "nothing answers: waits for the timeout",
			args: []string{"--connect-addr", connectV4, "--timeout", "1500ms"},
			want: outcome{code: 95, want: []string{"ipv4 check failed (not-redirected)", "within 1.5s", "i/o timeout"}},
			// Nothing arrives early; the whole timeout is waited for.
			minTime: 1500 * time.Millisecond,
		},
		{
			name: "refused",
			args: []string{"--connect-addr", nt.HostPort(nt.PeerExtraIPv4B, 20001)},
			want: outcome{code: 95, want: []string{"ipv4 check failed (not-redirected)", "connection refused"}},
		},
		{
			name: "ipv6 refused",
			args: []string{"--connect-addr", nt.HostPort(nt.PeerExtraIPv6B, 20001), "--listen-addr", "[::]:4140"},
			want: outcome{code: 95, want: []string{"ipv6 check failed (not-redirected)", "connection refused"}},
		},
		{
			name: "as nobody without capabilities: refused is still exit 95",
			who:  asNobody,
			args: []string{"--connect-addr", nt.HostPort(nt.PeerExtraIPv4B, 20001)},
			want: outcome{code: 95, want: []string{"ipv4 check failed (not-redirected)", "connection refused"}},
		},
		{
			name:   "a real server answers: token mismatch",
			server: ":20001",
			args:   []string{"--connect-addr", nt.HostPort(nt.PeerExtraIPv4B, 20001)},
			want:   outcome{code: 95, want: []string{"ipv4 check failed (token-mismatch)", `got \"server :20001\"`}},
		},
		{
			name: "connecting to the listener itself is not a redirect",
			args: []string{"--connect-addr", "127.0.0.1:4140"},
			want: outcome{code: 95, want: []string{"ipv4 check failed (wrong-original-destination)", "it was not redirected"}},
		},
		{
			name:      "listen port taken is not a redirect failure",
			podServer: ":4141",
			args:      []string{"--connect-addr", connectV4, "--listen-addr", "0.0.0.0:4141"},
			want:      outcome{code: 1, want: []string{"validator could not run", "address already in use"}},
		},
		{
			name:      "a proven failure wins over a check that could not run",
			podServer: ":4141",
			args: []string{"--connect-addr", nt.HostPort(nt.PeerExtraIPv4B, 20001),
				"--ipv6", "--ipv6-connect-addr", connectV6, "--ipv6-listen-addr", "[::]:4141"},
			want: outcome{code: 95, want: []string{"ipv4 check failed (not-redirected)", "listen on [::]:4141", "address already in use"}},
		},
		{
			name: "bad flags",
			args: []string{"--connect-addr", "nowhere"},
			want: outcome{code: 2, want: []string{`--connect-addr "nowhere"`}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := nt.NewPair(t)
			if tc.server != "" {
				nt.StartServer(t, p.Peer, tc.server)
			}
			if tc.podServer != "" {
				nt.StartServer(t, p.Pod, tc.podServer)
			}
			start := time.Now()
			code, log := validate(t, p.Pod, tc.who, tc.args...)
			tc.want.check(t, code, log)
			if d := time.Since(start); d < tc.minTime {
				t.Errorf("returned after %s, before the %s timeout", d, tc.minTime)
			}
		})
	}
}

func (o outcome) check(t *testing.T, code int, log string) {
	t.Helper()
	if code != o.code {
		t.Errorf("exit code %d, want %d", code, o.code)
	}
	for _, w := range o.want {
		if !strings.Contains(log, w) {
			t.Errorf("log lacks %q", w)
		}
	}
	for _, n := range o.not {
		if strings.Contains(log, n) {
			t.Errorf("log has %q", n)
		}
	}
	if t.Failed() {
		t.Logf("validator log:\n%s", log)
	}
}
