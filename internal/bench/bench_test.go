package bench

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// runs is how many times each command is timed; the median is reported.
const runs = 21

var chartArgs = []string{
	"--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102",
	"--inbound-ports-to-ignore", "4190,4191,4567,4568", "--outbound-ports-to-ignore", "4567,4568",
}

func chartConfig() iptables.Config { return iptablestest.ChartConfig() }

// manySubnets returns n host subnets from the documentation ranges, half IPv4 and half IPv6.
func manySubnets(n int) []string {
	var out []string
	// Not 192.0.2.0/24: the connection-rate runs dial a peer there, which must not be skipped.
	v4 := []string{"198.51.100.", "203.0.113."}
	for i := 0; i < n/2; i++ {
		out = append(out, fmt.Sprintf("%s%d/32", v4[i/250], i%250+1))
	}
	for i := 0; i < n-n/2; i++ {
		out = append(out, fmt.Sprintf("2001:db8:%x::/48", i+1))
	}
	return out
}

// manyIPv4Subnets returns n distinct IPv4 subnets from the documentation ranges: their /32s,
// then their /31s, and so on.
func manyIPv4Subnets(n int) []string {
	var out []string
	for bits := 32; len(out) < n && bits >= 24; bits-- {
		for _, base := range []string{"192.0.2.", "198.51.100.", "203.0.113."} {
			for i := 0; i < 256 && len(out) < n; i += 1 << (32 - bits) {
				out = append(out, fmt.Sprintf("%s%d/%d", base, i, bits))
			}
		}
	}
	return out
}

// portRanges returns n disjoint port ranges.
func portRanges(n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, fmt.Sprintf("%d-%d", 20000+i*10, 20000+i*10+4))
	}
	return out
}

// step is one process to time, run inside a fresh network namespace the way a pod's init
// container runs: already in the namespace, with no --netns to enter.
type step struct {
	name  string
	args  []string
	stdin string
}

// timeSteps runs the steps in a fresh namespace and returns their total wall time. Namespace
// creation is not timed. Standard input and output are files, not pipes, so the harness adds no
// copying goroutines to either side of a comparison.
func timeSteps(b *testing.B, steps []step) time.Duration {
	b.Helper()
	n, err := testutils.NewNS()
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		n.Close()
		testutils.UnmountNS(n)
	}()
	// Loopback up, as in every pod (TPROXY's IPv6 route needs it); not timed.
	if err := netnsutil.Do(n.Path(), func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		return netlink.LinkSetUp(lo)
	}); err != nil {
		b.Fatal(err)
	}
	dir := b.TempDir()
	var total time.Duration
	for i, s := range steps {
		in := filepath.Join(dir, fmt.Sprintf("stdin%d", i))
		if err := os.WriteFile(in, []byte(s.stdin), 0o600); err != nil {
			b.Fatal(err)
		}
		stdin, err := os.Open(in)
		if err != nil {
			b.Fatal(err)
		}
		out, err := os.Create(filepath.Join(dir, fmt.Sprintf("out%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(s.name, s.args...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, out, out
		err = netnsutil.Do(n.Path(), func() error {
			start := time.Now()
			err := cmd.Run()
			total += time.Since(start)
			return err
		})
		stdin.Close()
		out.Close()
		if err != nil {
			msg, _ := os.ReadFile(out.Name())
			b.Fatalf("%s %s: %v: %s", s.name, strings.Join(s.args, " "), err, msg)
		}
	}
	return total
}

func median(d []time.Duration) time.Duration {
	slices.Sort(d)
	return d[len(d)/2]
}

// compare times candidate and baseline alternately, so drift hits both alike.
func compare(b *testing.B, candidate, baseline []step) (time.Duration, time.Duration) {
	var c, base []time.Duration
	for i := 0; i < runs; i++ {
		c = append(c, timeSteps(b, candidate))
		base = append(base, timeSteps(b, baseline))
	}
	return median(c), median(base)
}

func restoreSteps(b *testing.B, flavor string, cfg iptables.Config) []step {
	rs, err := iptables.Build(cfg)
	if err != nil {
		b.Fatal(err)
	}
	var steps []step
	for _, f := range rs.Families {
		bin := "iptables-" + flavor + "-restore"
		if f == iptables.IPv6 {
			bin = "ip6tables-" + flavor + "-restore"
		}
		steps = append(steps, step{name: bin, args: []string{"--noflush"}, stdin: iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f))})
	}
	return steps
}

type row struct {
	what             string
	got, base        time.Duration
	baseName, target string
	limit            float64 // 0: a reference figure with no target
}

func (r row) String() string {
	ratio := float64(r.got) / float64(r.base)
	verdict := "meets"
	if ratio > r.limit {
		verdict = "MISSES"
	}
	line := fmt.Sprintf("%-58s %8s  vs %-40s %8s  = %.2fx", r.what, ms(r.got), r.baseName, ms(r.base), ratio)
	if r.limit == 0 {
		return line + "  (" + r.target + ")"
	}
	return line + fmt.Sprintf("  (target %s: %s)", r.target, verdict)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// goBuild builds pkg, run from dir, as `make build` builds binaries: static, no cgo. A cgo build
// starts glibc threads and the dynamic loader, which costs several milliseconds per run.
func goBuild(b *testing.B, dir, pkg, name string) string {
	bin := filepath.Join(b.TempDir(), name)
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("build %s: %v\n%s", pkg, err, out)
	}
	return bin
}

func buildProxyInit(b *testing.B) string {
	return goBuild(b, "", "github.com/kubemesh/proxy-init/cmd/proxy-init", "proxy-init")
}

// buildEmptyGo builds a Go program whose main does nothing: the least any Go tool pays to start.
func buildEmptyGo(b *testing.B) string {
	dir := b.TempDir()
	for name, text := range map[string]string{"go.mod": "module empty\n", "main.go": "package main\n\nfunc main() {}\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	return goBuild(b, dir, ".", "empty")
}

func proxyInit(bin, mode string, extra ...string) []step {
	args := append([]string{"--iptables-mode", mode, "--log-level", "error"}, chartArgs...)
	return []step{{name: bin, args: append(args, extra...)}}
}

// BenchmarkApply prints apply latency, process start-up included, in fresh namespaces.
// Run it with `make bench` (-benchtime 1x: it does its own repetitions).
func BenchmarkApply(b *testing.B) {
	nt.RequireRoot(b)
	bin := buildProxyInit(b)
	empty := buildEmptyGo(b)
	var rows []row
	for _, flavor := range []string{"nft", "legacy"} {
		// The nft mode writes iptables-nft's rules over netlink and execs nothing; legacy runs
		// the two restores itself.
		limit, target := 1.3, "<= 1.3x"
		if flavor == "nft" {
			limit, target = 0.85, "<= 0.85x"
		}
		restores := restoreSteps(b, flavor, chartConfig())
		got, base := compare(b, proxyInit(bin, flavor), restores)
		rows = append(rows, row{"proxy-init --iptables-mode " + flavor + ", chart defaults, v4+v6", got, base,
			"2x " + flavor + " iptables-restore, same payloads", target, limit})
		// What no Go tool that runs the two restores can beat: starting at all, then the restores.
		floor := append([]step{{name: empty}}, restores...)
		got, base = compare(b, floor, restores)
		rows = append(rows, row{"  floor: an empty Go program, then the same 2 restores", got, base,
			"2x " + flavor + " iptables-restore, same payloads", "the least any Go tool can reach here", 0})
		if flavor == "legacy" {
			got, base = compare(b, proxyInit(bin, flavor), floor)
			rows = append(rows, row{"proxy-init --iptables-mode legacy, chart defaults, v4+v6", got, base,
				"an empty Go program + the same 2 restores", "<= 1.1x", 1.1})
			// Where the difference goes: starting the larger binary instead of an empty one.
			got, base = compare(b, append([]step{{name: bin, args: []string{"version"}}}, restores...), floor)
			rows = append(rows, row{"  where it goes: proxy-init version, then the 2 restores", got, base,
				"an empty Go program + the same 2 restores", "start-up of the larger binary", 0})
		}

		subnets := manySubnets(1000)
		cfg := chartConfig()
		cfg.InboundSubnetsToIgnore = subnets
		restores = restoreSteps(b, flavor, cfg)
		got, base = compare(b, proxyInit(bin, flavor, "--subnets-to-ignore", strings.Join(subnets, ",")), restores)
		rows = append(rows, row{"proxy-init --iptables-mode " + flavor + ", 1,000 inbound subnets", got, base,
			"2x " + flavor + " iptables-restore, same payloads", "<= 1.5x", 1.5})
		if flavor == "nft" {
			// The same number of rules in one family: one restore writes exactly what we write.
			v4 := manyIPv4Subnets(1000)
			cfg := chartConfig()
			cfg.InboundSubnetsToIgnore, cfg.IPv6 = v4, false
			got, base = compare(b, proxyInit(bin, flavor, "--ipv6=false", "--subnets-to-ignore", strings.Join(v4, ",")), restoreSteps(b, flavor, cfg))
			rows = append(rows, row{"proxy-init --iptables-mode nft, 1,000 inbound subnets, IPv4 only", got, base,
				"1x iptables-nft-restore, same rules", "<= 1.0x", 1.0})
			continue
		}
		got, base = compare(b, append([]step{{name: empty}}, restores...), restores)
		rows = append(rows, row{"  floor: an empty Go program, then the same 2 restores", got, base,
			"2x " + flavor + " iptables-restore, same payloads", "the least any Go tool can reach here", 0})
	}
	rows = append(rows, nftablesRows(b, bin)...)
	rows = append(rows, everyFeatureRows(b, bin)...)
	fmt.Printf("\nApply latency, median of %d runs, each in a fresh network namespace, process start-up included:\n", runs)
	for _, r := range rows {
		fmt.Println(r)
	}
	connectionRates(b)
}

// everyFeature turns on every redirect feature beyond Linkerd's. IPv6 stays on (not auto, which
// a fresh namespace with loopback only decides against) so both sides write both families.
var everyFeature = []string{
	"--redirect-dns-to-port", "5353", "--inbound-mode", "tproxy", "--outbound-ports-to-redirect", "80,443,8080",
	"--outbound-subnets-to-redirect", "192.0.2.0/24,2001:db8::/32", "--interfaces-to-ignore", "net1,net2",
	"--uids-to-ignore", "1000,1001", "--gids-to-ignore", "3000", "--drop-invalid", "--ipv6=true",
}

// everyFeatureRows compares, per backend, an apply with every feature on (the mangle and raw
// tables, the kernel's TPROXY probe and the policy routing over rtnetlink included) with the
// chart defaults' apply.
func everyFeatureRows(b *testing.B, bin string) []row {
	cfg := chartConfig()
	cfg.RedirectDNSToPort, cfg.InboundMode, cfg.DropInvalid = 5353, iptables.InboundTPROXY, true
	cfg.OutboundPortsToRedirect, cfg.OutboundSubnetsToRedirect = []string{"80,443,8080"}, []string{"192.0.2.0/24,2001:db8::/32"}
	cfg.InterfacesToIgnore, cfg.UIDsToIgnore, cfg.GIDsToIgnore = []string{"net1,net2"}, []string{"1000,1001"}, []string{"3000"}
	var rows []row
	for _, mode := range []string{"nft", "nftables", "legacy"} {
		got, base := compare(b, proxyInit(bin, mode, everyFeature...), proxyInit(bin, mode))
		rows = append(rows, row{"proxy-init --iptables-mode " + mode + ", every feature on, v4+v6", got, base,
			"the same, chart defaults", "<= 1.5x", 1.5})
		if mode == "nftables" {
			continue
		}
		// What the same rules cost the kernel and its own tool: the growth no writer avoids.
		got, base = compare(b, restoreSteps(b, mode, cfg), restoreSteps(b, mode, chartConfig()))
		rows = append(rows, row{"  floor: 2x " + mode + " iptables-restore, every feature's payloads", got, base,
			"the same, chart defaults' payloads", "the growth of the rules themselves", 0})
	}
	return rows
}

// BenchmarkAgainstBaseline compares this proxy-init with another build of it, named by
// $PROXY_INIT_BENCH_BASELINE (the last release, or the commit before a change), mode by mode in
// the same run: what "no mode slower than before" is measured with. It is skipped when unset.
func BenchmarkAgainstBaseline(b *testing.B) {
	nt.RequireRoot(b)
	old := os.Getenv("PROXY_INIT_BENCH_BASELINE")
	if old == "" {
		b.Skip("PROXY_INIT_BENCH_BASELINE names no proxy-init to compare with")
	}
	bin := buildProxyInit(b)
	subnets := []string{"--subnets-to-ignore", strings.Join(manySubnets(1000), ",")}
	var rows []row
	for _, c := range []struct {
		mode  string
		extra []string
		what  string
	}{
		{"nft", nil, "chart defaults"}, {"nftables", nil, "chart defaults"}, {"auto", nil, "chart defaults"},
		{"legacy", nil, "chart defaults"}, {"nft", subnets, "1,000 inbound subnets"}, {"nftables", subnets, "1,000 inbound subnets"},
		{"legacy", subnets, "1,000 inbound subnets"},
	} {
		got, base := compare(b, proxyInit(bin, c.mode, c.extra...), proxyInit(old, c.mode, c.extra...))
		rows = append(rows, row{"proxy-init --iptables-mode " + c.mode + ", " + c.what, got, base,
			"the same with " + filepath.Base(old), "<= 1.0x", 1.0})
	}
	fmt.Printf("\nApply latency against %s, median of %d runs each:\n", old, runs)
	for _, r := range rows {
		fmt.Println(r)
	}
}

// connectionRates prints how many new outbound connections per second pass through the rules,
// with and without 1,000 outbound skip subnets that the traffic does not match, for each backend.
func connectionRates(b *testing.B) {
	fmt.Printf("\nNew outbound connections per second through the rules (redirected to a local proxy):\n")
	for _, mode := range connectionModes() {
		for _, n := range []int{0, 1000} {
			w := nt.NewPair(b)
			nt.StartProxy(b, w.Pod, 4140, 4143)
			c := chartConfig()
			c.Mode = iptables.Mode(mode)
			c.OutboundSubnetsToIgnore = manySubnets(n)
			applyIn(b, w.Pod, c)
			rate := dialRate(b, w.Pod, nt.HostPort(nt.PeerIPv4, 80), 2*time.Second)
			fmt.Printf("  %-10s %5d skip subnets: %8.0f conn/s\n", mode, n, rate)
		}
	}
}

// dialRate opens and closes connections from inside n for d and returns the rate.
func dialRate(b *testing.B, n *nt.NS, addr string, d time.Duration) float64 {
	var count int
	err := n.Do(func() error {
		deadline := time.Now().Add(d)
		start := time.Now()
		for time.Now().Before(deadline) {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				return err
			}
			c.(*net.TCPConn).SetLinger(0)
			c.Close()
			count++
		}
		d = time.Since(start)
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return float64(count) / d.Seconds()
}
