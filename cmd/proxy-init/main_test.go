package main_test

// These tests run the built proxy-init binary, as root, against throwaway network namespaces:
// the command line, --netns entry, exit codes and output as a user (or the kubelet) sees them.
// Flag parsing details are unit-tested in package proxyinit.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/proxyinit"
	"github.com/kubemesh/proxy-init/test/cnitest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

var binary string // built once by TestMain

func TestMain(m *testing.M) {
	code := func() int {
		dir, err := os.MkdirTemp("", "proxy-init-bin-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer os.RemoveAll(dir)
		binary = filepath.Join(dir, "proxy-init")
		if err := cnitest.GoBuild(dir, "."); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return m.Run()
	}()
	os.Exit(code)
}

// newNS returns the path of a fresh network namespace, removed at cleanup.
func newNS(t *testing.T) string {
	t.Helper()
	return nt.NewNS(t).Path()
}

type result struct {
	code           int
	stdout, stderr string
}

// run runs the binary with args and returns its exit code and output.
func run(t *testing.T, args ...string) result {
	t.Helper()
	return runWrapped(t, nil, args...)
}

// runWrapped runs the binary under a wrapper program (a tracer, a capability dropper; none when
// nil) and returns its exit code and output.
func runWrapped(t *testing.T, wrapper []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	argv := append(append(slices.Clone(wrapper), binary), args...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exitErr *exec.ExitError
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		r.code = exitErr.ExitCode()
	default:
		t.Fatalf("run %q: %v", argv, err)
	}
	return r
}

func mustRun(t *testing.T, want int, args ...string) result {
	t.Helper()
	r := run(t, args...)
	if r.code != want {
		t.Fatalf("proxy-init %q: exit %d, want %d\nstdout:\n%s\nstderr:\n%s", args, r.code, want, r.stdout, r.stderr)
	}
	return r
}

// inNS runs a command inside the namespace and returns its output.
func inNS(t *testing.T, nsPath, name string, args ...string) string {
	t.Helper()
	out, stderr := nt.Output(t, nt.Existing(nsPath, nsPath), "", name, args...)
	return out + stderr
}

// saveNat is *-save -t nat without the timestamped comment lines, so runs compare.
func saveNat(t *testing.T, nsPath, bin string) string {
	t.Helper()
	var keep []string
	for _, l := range strings.Split(inNS(t, nsPath, bin, "-t", "nat"), "\n") {
		if !strings.HasPrefix(l, "#") && l != "" {
			keep = append(keep, l)
		}
	}
	return strings.Join(keep, "\n")
}

// legacyTables lists the legacy xtables tables instantiated in the namespace, both families. The
// kernel lists a legacy table only once something touched it, so "" means nothing did.
func legacyTables(t *testing.T, nsPath string) string {
	t.Helper()
	var all []string
	for _, file := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
		var data []byte
		err := netnsutil.Do(nsPath, func() error {
			var err error
			data, err = os.ReadFile(file)
			return err
		})
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("read %s: %v", file, err)
		}
		all = append(all, strings.Fields(string(data))...)
	}
	return strings.Join(all, " ")
}

// assertPristine checks that nothing at all was written into the namespace: no legacy table was
// even instantiated and nf_tables holds nothing.
func assertPristine(t *testing.T, nsPath string) {
	t.Helper()
	if names := legacyTables(t, nsPath); names != "" {
		t.Errorf("legacy tables %q exist in the namespace; want none", names)
	}
	if out := inNS(t, nsPath, "nft", "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Errorf("nft list ruleset in the namespace is not empty:\n%s", out)
	}
	for _, v := range []string{"-4", "-6"} {
		if out := inNS(t, nsPath, "ip", v, "rule", "show", "table", strconv.Itoa(int(iptables.TPROXYTable))); strings.TrimSpace(out) != "" {
			t.Errorf("ip %s rule in the namespace: %s", v, out)
		}
	}
}

// everyFeature turns on every feature beyond Linkerd's.
var everyFeature = []string{
	"--redirect-dns-to-port", "5353", "--inbound-mode", "tproxy", "--outbound-ports-to-redirect", "80,443",
	"--outbound-subnets-to-redirect", "192.0.2.0/24", "--interfaces-to-ignore", "net1", "--uids-to-ignore", "1000",
	"--gids-to-ignore", "3000", "--drop-invalid", "--ipv6=auto", "--reroute-virtual-interfaces", "tap0",
}

var chart = []string{
	"--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102",
	"--inbound-ports-to-ignore", "4190,4191,4567,4568", "--outbound-ports-to-ignore", "443,6443",
}

func args(parts ...[]string) []string {
	var out []string
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

var modes = []struct {
	mode, save, otherSave string
}{
	{"legacy", "iptables-legacy-save", "iptables-nft-save"},
	{"nft", "iptables-nft-save", "iptables-legacy-save"},
}

func TestApplyShowCleanup(t *testing.T) {
	nt.RequireRoot(t)
	for _, m := range modes {
		t.Run(m.mode, func(t *testing.T) {
			ns := newNS(t)
			flags := args(chart, []string{"--netns", ns, "--iptables-mode", m.mode})

			r := mustRun(t, 0, flags...)
			if !strings.Contains(r.stderr, "changed=true") || !strings.Contains(r.stderr, "backend=iptables-"+m.mode) {
				t.Errorf("apply log lacks changed=true or the backend:\n%s", r.stderr)
			}
			first := saveNat(t, ns, m.save)
			if !strings.Contains(first, `-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 443,6443 -m comment --comment "proxy-init/ignore-port-443,6443" -j RETURN`) {
				t.Fatalf("%s after apply lacks the outbound ignore rule:\n%s", m.save, first)
			}

			// The same command line with the subcommand first: show, as JSON.
			r = mustRun(t, 0, args([]string{"show", "--output", "json"}, flags)...)
			var rep proxyinit.ShowReport
			if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
				t.Fatalf("show --output json is not JSON: %v\n%s", err, r.stdout)
			}
			if !rep.Match || rep.Backend != "iptables-"+m.mode || len(rep.Families) != 2 || len(rep.Families[0].Rules) != 8 {
				t.Errorf("show report %+v: want a match on iptables-%s with 8 IPv4 rules", rep, m.mode)
			}

			// A re-run changes nothing.
			r = mustRun(t, 0, flags...)
			if !strings.Contains(r.stderr, "changed=false") {
				t.Errorf("second apply log lacks changed=false:\n%s", r.stderr)
			}
			if again := saveNat(t, ns, m.save); again != first {
				t.Errorf("second apply changed %s:\nbefore:\n%s\nafter:\n%s", m.save, first, again)
			}

			// Delete one rule by hand: show must fail and name it.
			lo := `-A PROXY_INIT_OUTPUT -o lo -m comment --comment "proxy-init/ignore-loopback" -j RETURN`
			bin := strings.TrimSuffix(m.save, "-save")
			inNS(t, ns, bin, "-t", "nat", "-D", "PROXY_INIT_OUTPUT", "-o", "lo", "-m", "comment", "--comment", "proxy-init/ignore-loopback", "-j", "RETURN")
			r = mustRun(t, 1, args([]string{"show"}, flags)...)
			if !strings.Contains(r.stdout, "missing: "+lo) {
				t.Errorf("show after deleting a rule does not name it:\n%s", r.stdout)
			}

			// Cleanup leaves nothing of ours, in either backend.
			mustRun(t, 0, "cleanup", "--netns", ns, "--iptables-mode", m.mode)
			for _, bin := range []string{m.save, m.otherSave, strings.Replace(m.save, "iptables", "ip6tables", 1)} {
				if out := saveNat(t, ns, bin); strings.Contains(out, "PROXY_INIT") || strings.Contains(out, "proxy-init/") {
					t.Errorf("%s after cleanup still holds our rules:\n%s", bin, out)
				}
			}
			// And cleanup is idempotent.
			mustRun(t, 0, "cleanup", "--netns", ns, "--iptables-mode", m.mode)
		})
	}
}

// TestLinkerdChartDefault runs the Linkerd chart's default (legacy chart) command line unchanged:
// no mode flags, so auto chooses, and logs why.
func TestLinkerdChartDefault(t *testing.T) {
	nt.RequireRoot(t)
	ns := newNS(t)
	r := mustRun(t, 0, args(chart, []string{"--netns", ns, "--log-format", "json"})...)
	var chosen struct{ Msg, Backend, Reason string }
	for _, l := range strings.Split(strings.TrimSpace(r.stderr), "\n") {
		var rec struct{ Msg, Backend, Reason string }
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("--log-format json wrote a non-JSON line %q: %v", l, err)
		}
		if rec.Msg == "backend chosen" {
			chosen = rec
		}
	}
	if chosen.Backend == "" || !strings.HasPrefix(chosen.Reason, "auto: ") {
		t.Errorf("no \"backend chosen\" log with an auto reason in:\n%s", r.stderr)
	}
	r = mustRun(t, 0, args([]string{"show"}, chart, []string{"--netns", ns})...)
	if !strings.Contains(r.stdout, "backend: "+chosen.Backend+"\n") || !strings.Contains(r.stdout, "rules match the configuration") {
		t.Errorf("show after the chart's apply:\n%s", r.stdout)
	}
}

// TestLinkerdChartNFT runs the Linkerd chart's nft command line unchanged.
func TestLinkerdChartNFT(t *testing.T) {
	nt.RequireRoot(t)
	ns := newNS(t)
	mustRun(t, 0, args([]string{"--firewall-bin-path", "iptables-nft", "--firewall-save-bin-path", "iptables-nft-save", "--netns", ns}, chart)...)
	if out := saveNat(t, ns, "iptables-nft-save"); !strings.Contains(out, "proxy-init/redirect-all-incoming-to-proxy-port") {
		t.Errorf("iptables-nft-save lacks our rules:\n%s", out)
	}
	if out := saveNat(t, ns, "ip6tables-nft-save"); !strings.Contains(out, "proxy-init/redirect-all-outgoing-to-proxy-port") {
		t.Errorf("ip6tables-nft-save lacks our rules:\n%s", out)
	}
	// Not iptables-legacy-save -t nat: naming the table makes the kernel instantiate it.
	if names := legacyTables(t, ns); names != "" {
		t.Errorf("the nft chart line touched legacy tables: %q", names)
	}
}

// TestUserNamespacePod runs the Linkerd chart's command lines (nft, legacy, the default auto)
// against a pod with hostUsers: false, from the host's user namespace: --netns names a network
// namespace that a user namespace of its own owns. Every mode writes the native table there, and
// says why; apply, show and cleanup work.
func TestUserNamespacePod(t *testing.T) {
	for _, mode := range []string{"nft", "legacy", "auto"} {
		t.Run(mode, func(t *testing.T) {
			ns := nt.NewUserNS(t).Path()
			flags := args(chart, []string{"--netns", ns, "--iptables-mode", mode})
			sim := mustRun(t, 0, args(flags, []string{"--simulate"})...)
			if !strings.Contains(sim.stdout, "# network namespace owned by user namespace user:[") || !strings.Contains(sim.stdout, "# nftables: the native table") {
				t.Errorf("--simulate does not show the native table and why:\n%s", sim.stdout)
			}
			r := mustRun(t, 0, flags...)
			for _, want := range []string{"changed=true", "backend=nftables", " userns=user:[",
				"(a pod with hostUsers: false): iptables' owner match is refused there from outside it; writing the native nftables table instead"} {
				if !strings.Contains(r.stderr, want) {
					t.Errorf("apply log lacks %q:\n%s", want, r.stderr)
				}
			}
			if out := inNS(t, ns, "nft", "list", "table", "inet", iptables.NFTTableName); !strings.Contains(out, "skuid 2102") {
				t.Errorf("the native table lacks the proxy's exemption:\n%s", out)
			}
			for _, bin := range []string{"iptables-nft-save", "iptables-legacy-save"} {
				if out := saveNat(t, ns, bin); strings.Contains(out, "PROXY_INIT") {
					t.Errorf("%s shows rules of ours besides the native table:\n%s", bin, out)
				}
			}
			if r := mustRun(t, 0, args([]string{"show"}, flags)...); !strings.Contains(r.stdout, "rules match the configuration") {
				t.Errorf("show:\n%s", r.stdout)
			}
			mustRun(t, 0, "cleanup", "--netns", ns, "--iptables-mode", mode)
			for _, bin := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save"} {
				if out := saveNat(t, ns, bin); strings.Contains(out, "PROXY_INIT") {
					t.Errorf("%s after cleanup still holds our rules:\n%s", bin, out)
				}
			}
			if out := inNS(t, ns, "nft", "list", "ruleset"); strings.Contains(out, iptables.NFTTableName) {
				t.Errorf("the native table survived cleanup:\n%s", out)
			}
		})
	}
}

// --simulate writes nothing in any mode. The netlink modes print the batch planned from the
// namespace's state, read for real: into a namespace already holding the rules, nothing.
func TestSimulateWritesNothing(t *testing.T) {
	nt.RequireRoot(t)
	tests := []struct {
		mode              string
		restores, batches int // iptables-restore payloads and nf_tables batches expected
	}{
		{"legacy", 2, 0}, {"nft", 0, 1}, {"plain", 2, 0}, {"nftables", 0, 1}, {"auto", 2, 2},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			ns := newNS(t)
			r := mustRun(t, 0, args(chart, []string{"--netns", ns, "--iptables-mode", tt.mode, "--simulate", "--timeout-close-wait-secs", "60"})...)
			if strings.Count(r.stdout, "*nat\n") != tt.restores || strings.Count(r.stdout, "COMMIT\n") != tt.restores {
				t.Errorf("simulate did not print %d iptables-restore payloads:\n%s", tt.restores, r.stdout)
			}
			if got := strings.Count(r.stdout, "# nf_tables transaction planned at ruleset generation "); got != tt.batches {
				t.Errorf("simulate printed %d batches planned from the namespace's state, want %d:\n%s", got, tt.batches, r.stdout)
			}
			assertPristine(t, ns)
		})
	}
	for _, mode := range []string{"nft", "nftables"} {
		t.Run(mode+"-applied", func(t *testing.T) {
			ns := newNS(t)
			mustRun(t, 0, args(chart, []string{"--netns", ns, "--iptables-mode", mode})...)
			r := mustRun(t, 0, args(chart, []string{"--netns", ns, "--iptables-mode", mode, "--simulate"})...)
			if !strings.Contains(r.stdout, "# nf_tables: nothing to send, planned at ruleset generation") {
				t.Errorf("simulate over the rules it would write wants to send something:\n%s", r.stdout)
			}
			r = mustRun(t, 0, args([]string{"cleanup", "--netns", ns, "--iptables-mode", mode, "--simulate"})...)
			if !strings.Contains(r.stdout, "delete chain ip nat PROXY_INIT_OUTPUT") && !strings.Contains(r.stdout, "delete table inet proxy_init") {
				t.Errorf("cleanup --simulate does not show the removal:\n%s", r.stdout)
			}
		})
	}
}

// TestNFTablesApplyShowCleanup drives the native nftables backend through the binary.
func TestNFTablesApplyShowCleanup(t *testing.T) {
	nt.RequireRoot(t)
	ns := newNS(t)
	flags := args(chart, []string{"--netns", ns, "--iptables-mode", "nftables"})
	mustRun(t, 0, flags...)
	r := mustRun(t, 0, args([]string{"show", "--output", "json"}, flags)...)
	var rep proxyinit.ShowReport
	if err := json.Unmarshal([]byte(r.stdout), &rep); err != nil {
		t.Fatalf("show --output json is not JSON: %v\n%s", err, r.stdout)
	}
	if !rep.Match || rep.Backend != "nftables" || len(rep.Families) == 0 || !rep.Expected[rep.Families[0].Family] {
		t.Errorf("show report %+v: want a match on nftables with rules expected", rep)
	}
	if r = mustRun(t, 0, flags...); !strings.Contains(r.stderr, "changed=false") {
		t.Errorf("second apply log lacks changed=false:\n%s", r.stderr)
	}

	// Delete the loopback rule by its handle: show must fail and name it.
	listing := inNS(t, ns, "nft", "-a", "list", "chain", "inet", "proxy_init", "PROXY_INIT_OUTPUT")
	handle := ""
	for _, l := range strings.Split(listing, "\n") {
		if strings.Contains(l, "proxy-init/ignore-loopback") {
			if _, h, ok := strings.Cut(l, "# handle "); ok {
				handle = strings.TrimSpace(h)
			}
		}
	}
	if handle == "" {
		t.Fatalf("no handle for the loopback rule in:\n%s", listing)
	}
	inNS(t, ns, "nft", "delete", "rule", "inet", "proxy_init", "PROXY_INIT_OUTPUT", "handle", handle)
	r = mustRun(t, 1, args([]string{"show"}, flags)...)
	if !strings.Contains(r.stdout, "missing: ") || !strings.Contains(r.stdout, "proxy-init/ignore-loopback") {
		t.Errorf("show after deleting a rule does not name it:\n%s", r.stdout)
	}

	mustRun(t, 0, "cleanup", "--netns", ns, "--iptables-mode", "nftables")
	if out := inNS(t, ns, "nft", "list", "ruleset"); strings.Contains(out, "proxy_init") || strings.Contains(out, "PROXY_INIT") {
		t.Errorf("nft ruleset after cleanup still holds our rules:\n%s", out)
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	nt.RequireRoot(t)
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"port out of range", []string{"-p", "4143", "-o", "70000"}, `--outgoing-proxy-port "70000": port is outside 1-65535`},
		{"reversed range", args(chart, []string{"--inbound-ports-to-ignore", "5000-4000"}), `--inbound-ports-to-ignore "5000-4000": range 5000-4000 is reversed`},
		{"bad CIDR", args(chart, []string{"--subnets-to-ignore", "10.0.0.0/8,300.0.0.0/8"}), `--subnets-to-ignore "300.0.0.0/8"`},
		{"unknown mode", args(chart, []string{"--iptables-mode", "bpf"}), `--iptables-mode "bpf": unknown mode`},
		{"uid 0", []string{"-p", "4143", "-o", "4140", "-u", "0"}, `--proxy-uid "0": refusing to exempt UID 0`},
		{"inconsistent firewall paths", args([]string{"--firewall-bin-path", "iptables-legacy", "--firewall-save-bin-path", "iptables-nft-save"}, chart), `--firewall-save-bin-path "iptables-nft-save"`},
		// The features beyond Linkerd's, each with the rest of them on, TPROXY's policy routing
		// included: one bad value and nothing at all is written.
		{"DNS port out of range", args(chart, everyFeature, []string{"--redirect-dns-to-port", "65536"}),
			"proxy-init: invalid input:\n  --redirect-dns-to-port \"65536\": port is outside 1-65535 (0: capture no DNS)\n"},
		{"include port out of range", args(chart, everyFeature, []string{"--outbound-ports-to-redirect", "80,65536"}),
			"proxy-init: invalid input:\n  --outbound-ports-to-redirect \"65536\": port 65536 is outside 1-65535\n"},
		{"invalid interface name", args(chart, everyFeature, []string{"--interfaces-to-ignore", "net1,eth0:1/x"}),
			"proxy-init: invalid input:\n  --interfaces-to-ignore \"eth0:1/x\": holds ':', which the kernel refuses in an interface name\n"},
		{"virtual machine interface also ignored", args(chart, everyFeature, []string{"--reroute-virtual-interfaces", "k6t-eth0,net1"}),
			"proxy-init: invalid input:\n  --reroute-virtual-interfaces \"net1\": also in interfaces-to-ignore: its traffic cannot both skip the proxy and reach it\n"},
		{"UID over 2^32-2", args(chart, everyFeature, []string{"--uids-to-ignore", "1000,4294967295"}),
			"proxy-init: invalid input:\n  --uids-to-ignore \"4294967295\": must be a UID from 1 to 4294967294\n"},
		{"GID over 2^32-2", args(chart, everyFeature, []string{"--gids-to-ignore", "4294967295"}),
			"proxy-init: invalid input:\n  --gids-to-ignore \"4294967295\": must be a GID from 1 to 4294967294\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ns := newNS(t)
			for _, sub := range [][]string{nil, {"show"}} {
				r := mustRun(t, 2, args(sub, tt.args, []string{"--netns", ns, "--timeout-close-wait-secs", "60"})...)
				// A want that starts as the message does is the whole of stderr.
				if exact := strings.HasPrefix(tt.want, "proxy-init: "); exact && r.stderr != tt.want || !exact && !strings.Contains(r.stderr, tt.want) {
					t.Errorf("stderr %q, want %q", r.stderr, tt.want)
				}
			}
			assertPristine(t, ns)
		})
	}
}

func TestCloseWaitSysctl(t *testing.T) {
	nt.RequireRoot(t)
	root, rootErr := os.ReadFile(iptables.CloseWaitSysctl) // read only: the root namespace is never written
	ns := newNS(t)
	mustRun(t, 0, args(chart, []string{"--netns", ns, "--timeout-close-wait-secs", "123"})...)
	if got := strings.TrimSpace(inNS(t, ns, "cat", iptables.CloseWaitSysctl)); got != "123" {
		t.Errorf("close-wait timeout in the namespace is %q, want 123", got)
	}
	if rootErr == nil {
		if now, err := os.ReadFile(iptables.CloseWaitSysctl); err != nil || !bytes.Equal(now, root) {
			t.Errorf("the root namespace's close-wait timeout changed from %q to %q (%v)", root, now, err)
		}
	}
}

func TestVersion(t *testing.T) {
	r := mustRun(t, 0, "version")
	if !strings.HasPrefix(r.stdout, "proxy-init ") {
		t.Errorf("version output %q", r.stdout)
	}
}
