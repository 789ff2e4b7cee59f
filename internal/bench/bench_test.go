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

	nt "github.com/kubemesh/proxy-init/internal/netnstest"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
)

// runs is how many times each command is timed; the median is reported.
const runs = 15

var chartArgs = []string{
	"--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102",
	"--inbound-ports-to-ignore", "4190,4191,4567,4568", "--outbound-ports-to-ignore", "4567,4568",
}

func chartConfig() iptables.Config {
	c := iptables.NewConfig()
	c.InboundProxyPort, c.OutboundProxyPort, c.ProxyUID = 4143, 4140, 2102
	c.InboundPortsToIgnore = []string{"4190,4191,4567,4568"}
	c.OutboundPortsToIgnore = []string{"4567,4568"}
	return c
}

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

// portRanges returns n disjoint port ranges.
func portRanges(n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, fmt.Sprintf("%d-%d", 20000+i*10, 20000+i*10+4))
	}
	return out
}

// step is one process to time; in runs it inside the fresh namespace, otherwise the command
// gets the namespace path via {netns}.
type step struct {
	name  string
	args  []string
	stdin string
	in    bool
}

// timeSteps runs the steps in a fresh namespace and returns their total wall time.
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
	var total time.Duration
	for _, s := range steps {
		args := make([]string, len(s.args))
		for i, a := range s.args {
			args[i] = strings.ReplaceAll(a, "{netns}", n.Path())
		}
		run := func() error {
			cmd := exec.Command(s.name, args...)
			cmd.Stdin = strings.NewReader(s.stdin)
			var out strings.Builder
			cmd.Stdout, cmd.Stderr = &out, &out
			start := time.Now()
			err := cmd.Run()
			total += time.Since(start)
			if err != nil {
				return fmt.Errorf("%s %s: %v: %s", s.name, strings.Join(args, " "), err, out.String())
			}
			return nil
		}
		if s.in {
			err = netnsutil.Do(n.Path(), run)
		} else {
			err = run()
		}
		if err != nil {
			b.Fatal(err)
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
		steps = append(steps, step{name: bin, args: []string{"--noflush"}, stdin: iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f)), in: true})
	}
	return steps
}

type row struct {
	what             string
	got, base        time.Duration
	baseName, target string
	limit            float64
}

func (r row) String() string {
	ratio := float64(r.got) / float64(r.base)
	verdict := "meets"
	if ratio > r.limit {
		verdict = "MISSES"
	}
	return fmt.Sprintf("%-58s %8s  vs %-40s %8s  = %.2fx  (target %s: %s)", r.what, ms(r.got), r.baseName, ms(r.base), ratio, r.target, verdict)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

func buildProxyInit(b *testing.B) string {
	bin := filepath.Join(b.TempDir(), "proxy-init")
	// Built as `make build` builds it: static, no cgo. A cgo build starts glibc threads and the
	// dynamic loader, which costs several milliseconds per run.
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "github.com/kubemesh/proxy-init/cmd/proxy-init")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	out, err := cmd.CombinedOutput()
	if err != nil {
		b.Fatalf("build proxy-init: %v\n%s", err, out)
	}
	return bin
}

func proxyInit(bin, mode string, extra ...string) []step {
	args := append([]string{"--netns", "{netns}", "--iptables-mode", mode, "--log-level", "error"}, chartArgs...)
	return []step{{name: bin, args: append(args, extra...)}}
}

// BenchmarkApply prints apply latency, process start-up included, in fresh namespaces.
// Run it with `make bench` (-benchtime 1x: it does its own repetitions).
func BenchmarkApply(b *testing.B) {
	nt.RequireRoot(b)
	bin := buildProxyInit(b)
	var rows []row
	for _, flavor := range []string{"nft", "legacy"} {
		got, base := compare(b, proxyInit(bin, flavor), restoreSteps(b, flavor, chartConfig()))
		rows = append(rows, row{"proxy-init --iptables-mode " + flavor + ", chart defaults, v4+v6", got, base,
			"2x " + flavor + " iptables-restore, same payloads", "<= 1.3x", 1.3})

		subnets := manySubnets(1000)
		cfg := chartConfig()
		cfg.InboundSubnetsToIgnore = subnets
		got, base = compare(b, proxyInit(bin, flavor, "--subnets-to-ignore", strings.Join(subnets, ",")), restoreSteps(b, flavor, cfg))
		rows = append(rows, row{"proxy-init --iptables-mode " + flavor + ", 1,000 inbound subnets", got, base,
			"2x " + flavor + " iptables-restore, same payloads", "<= 1.5x", 1.5})
	}
	rows = append(rows, nftablesRows(b, bin)...)
	fmt.Printf("\nApply latency, median of %d runs, each in a fresh network namespace, process start-up included:\n", runs)
	for _, r := range rows {
		fmt.Println(r)
	}
	connectionRates(b)
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
