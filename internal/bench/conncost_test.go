package bench

import (
	"context"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// Each latency row times latencyConns connections, latencyRounds times as many in turns with
// the other rows of its direction, so the machine's drift spreads over all of them alike; the
// first latencyWarmup of each row are not timed.
const (
	latencyConns  = 2000
	latencyRounds = 10
	latencyWarmup = 100
)

// BenchmarkConnectionCost prints what the redirect itself costs each connection, beside a floor
// without rules: the time from connect() to the proxy's accept(), outbound (the app to the proxy's
// outbound port, REDIRECT) and inbound (a peer to the proxy's inbound port, REDIRECT or TPROXY),
// for IPv4 and IPv6, with and without 1,000 skip subnets the traffic does not match; the
// conntrack entries each proxied connection and each captured DNS query add in the pod's
// namespace; and the kernel memory one pod's ruleset takes. Run it with `make bench`
// (-benchtime 1x: it does its own repetitions).
func BenchmarkConnectionCost(b *testing.B) {
	nt.RequireRoot(b)
	fmt.Printf("\nconnect() to accept() through the rules, %d connections one after another per row, p50 / p99 (load average %s):\n",
		latencyConns, loadAverage())
	latencyRows(b)
	conntrackRows(b)
	slabRows(b)
}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
}

// latencyCase is one row: a ruleset (nil: none, the floor) and the direction it is measured in.
type latencyCase struct {
	what    string
	mode    string // empty: no rules
	tproxy  bool
	subnets int
}

func latencyRows(b *testing.B) {
	for _, inbound := range []bool{false, true} {
		dir := "outbound: the app dials a peer, REDIRECTed to the proxy's port 4140"
		if inbound {
			dir = "inbound: a peer dials the pod's port 8080, sent to the proxy's port 4143"
		}
		fmt.Printf("  %s\n", dir)
		cases := []latencyCase{{what: "no rules (floor: straight to the listener)"}}
		for _, subnets := range []int{0, 1000} {
			for _, mode := range connectionModes() {
				cases = append(cases, latencyCase{what: mode + " REDIRECT", mode: mode, subnets: subnets})
			}
			if inbound {
				for _, mode := range connectionModes() {
					cases = append(cases, latencyCase{what: mode + " TPROXY", mode: mode, tproxy: true, subnets: subnets})
				}
			}
		}
		var rows []*latencyRow
		for _, c := range cases {
			rows = append(rows, newLatencyRow(b, c, inbound))
		}
		for round := 0; round < latencyRounds; round++ {
			n := latencyConns / latencyRounds
			if round == 0 {
				n += latencyWarmup
			}
			for _, r := range rows {
				r.time(b, n, round == 0)
			}
		}
		for _, r := range rows {
			what := r.what
			if r.subnets > 0 {
				what += fmt.Sprintf(", %d skip subnets", r.subnets)
			}
			fmt.Printf("    %-46s IPv4 %s   IPv6 %s\n", what, r.percentiles(0), r.percentiles(1))
		}
	}
}

// latencyRow is one row's namespaces, with c's rules, its listeners and what it timed, per family.
type latencyRow struct {
	latencyCase
	from     *nt.NS
	addrs    [2]string
	accepted [2]chan time.Time
	took     [2][]time.Duration
}

func newLatencyRow(b *testing.B, c latencyCase, inbound bool) *latencyRow {
	w := nt.NewPair(b)
	port := 4140
	if inbound {
		port = 4143
	}
	r := &latencyRow{latencyCase: c, from: w.Pod}
	if inbound {
		r.from = w.Peer
	}
	for i, l := range listenBoth(b, w.Pod, port, c.tproxy) {
		r.accepted[i] = acceptLoop(l)
	}
	if c.mode != "" {
		cfg := chartConfig()
		cfg.Mode = iptables.Mode(c.mode)
		if c.tproxy {
			cfg.InboundMode = iptables.InboundTPROXY
		}
		if inbound {
			cfg.InboundSubnetsToIgnore = skipSubnets(c.subnets)
		} else {
			cfg.OutboundSubnetsToIgnore = skipSubnets(c.subnets)
		}
		applyIn(b, w.Pod, cfg)
	}
	for i, fam := range []struct{ pod, peer, lo string }{{nt.PodIPv4, nt.PeerIPv4, "127.0.0.1"}, {nt.PodIPv6, nt.PeerIPv6, "::1"}} {
		// Where the rules send the connection, and the floor's straight dial to the same listener.
		switch {
		case inbound && c.mode == "":
			r.addrs[i] = nt.HostPort(fam.pod, port)
		case inbound:
			r.addrs[i] = nt.HostPort(fam.pod, 8080)
		case c.mode == "":
			r.addrs[i] = nt.HostPort(fam.lo, port)
		default:
			r.addrs[i] = nt.HostPort(fam.peer, 80)
		}
	}
	return r
}

// acceptLoop accepts on l until it is closed, closing each connection and sending when it was
// accepted.
func acceptLoop(l net.Listener) chan time.Time {
	accepted := make(chan time.Time)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			at := time.Now()
			c.Close()
			accepted <- at
		}
	}()
	return accepted
}

// time dials each family's address n times from inside the row's namespace, one connection after
// another, and keeps the time from before connect() to the return of the listener's accept(),
// but for the first latencyWarmup when warm.
func (r *latencyRow) time(b *testing.B, n int, warm bool) {
	err := r.from.Do(func() error {
		for f := range r.addrs {
			for i := 0; i < n; i++ {
				start := time.Now()
				c, err := net.DialTimeout("tcp", r.addrs[f], 2*time.Second)
				if err != nil {
					return err
				}
				at, ok := <-r.accepted[f]
				if !ok {
					return fmt.Errorf("the listener closed")
				}
				// A reset, not TIME_WAIT: thousands of connections leave no ports behind.
				c.(*net.TCPConn).SetLinger(0)
				c.Close()
				if !warm || i >= latencyWarmup {
					r.took[f] = append(r.took[f], at.Sub(start))
				}
			}
		}
		return nil
	})
	if err != nil {
		b.Fatalf("%s: %v", r.what, err)
	}
}

func (r *latencyRow) percentiles(f int) string {
	d := slices.Clone(r.took[f])
	slices.Sort(d)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1000 }
	return fmt.Sprintf("%6.1f / %6.1f µs", us(d[len(d)/2]), us(d[len(d)*99/100]))
}

// skipSubnets returns n subnets of each family that no test address falls in: half IPv4 (none in
// 192.0.2.0/24, where the pod and the peer are) and half IPv6 (none in 2001:db8::/48).
func skipSubnets(n int) []string {
	if n == 0 {
		return nil
	}
	var out []string
	for bits := 32; len(out) < n/2; bits-- {
		for _, base := range []string{"198.51.100.", "203.0.113."} {
			for i := 0; i < 256 && len(out) < n/2; i += 1 << (32 - bits) {
				out = append(out, fmt.Sprintf("%s%d/%d", base, i, bits))
			}
		}
	}
	for i := 0; len(out) < n; i++ {
		out = append(out, fmt.Sprintf("2001:db8:%x::/48", i+1))
	}
	return out
}

// listenBoth listens on port inside n, IPv4 and IPv6 apart, transparent (IP_TRANSPARENT) for TPROXY.
func listenBoth(b *testing.B, n *nt.NS, port int, transparent bool) [2]net.Listener {
	var lc net.ListenConfig
	if transparent {
		lc.Control = func(network, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				if network == "tcp6" {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_TRANSPARENT, 1)
					return
				}
				serr = unix.SetsockoptInt(int(fd), unix.SOL_IP, unix.IP_TRANSPARENT, 1)
			})
			if err != nil {
				return err
			}
			return serr
		}
	}
	var ls [2]net.Listener
	err := n.Do(func() error {
		for i, network := range []string{"tcp4", "tcp6"} {
			l, err := lc.Listen(context.Background(), network, ":"+strconv.Itoa(port))
			if err != nil {
				return err
			}
			b.Cleanup(func() { l.Close() })
			ls[i] = l
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return ls
}

// ctConns is how many connections or queries each conntrack figure is counted over.
const ctConns = 100

// conntrackRows prints the conntrack entries one proxied outbound connection adds in the pod's
// namespace, its two legs apart (the app's connection, REDIRECTed to the proxy; the proxy's own
// to the peer, exempt by its UID), and what one UDP DNS query adds with DNS capture and without,
// for each backend and with no rules (no netfilter hook in the namespace: conntrack is off there).
func conntrackRows(b *testing.B) {
	fmt.Printf("\nConntrack entries in the pod's namespace per connection or query (nf_conntrack_count over %d of each):\n", ctConns)
	fmt.Printf("  %-10s %-28s %-30s %-24s %-24s %s\n", "rules", "app -> proxy (v4 / v6)", "proxy (uid 2102) -> peer", "DNS query, no capture", "DNS query, captured", "proxy's DNS forward")
	for _, mode := range append([]string{""}, connectionModes()...) {
		name := mode
		if mode == "" {
			name = "none"
		}
		var cols []string
		for _, dns := range []bool{false, true} {
			w := nt.NewPair(b)
			nt.StartProxy(b, w.Pod, 4140)
			nt.StartServer(b, w.Peer, ":80")
			for _, a := range []string{nt.PeerIPv4, nt.PeerIPv6} {
				nt.StartUDPServer(b, w.Peer, nt.HostPort(a, 53), "nameserver")
			}
			for _, lo := range []string{"127.0.0.1", "::1"} {
				nt.StartUDPServer(b, w.Pod, nt.HostPort(lo, 5353), "dns-proxy")
			}
			if mode != "" {
				cfg := chartConfig()
				cfg.Mode = iptables.Mode(mode)
				if dns {
					cfg.RedirectDNSToPort = 5353
				}
				applyIn(b, w.Pod, cfg)
			}
			pair := func(network string, port int, o nt.DialOpts, direct, want string) string {
				var per []string
				for _, fam := range []struct{ peer, lo string }{{nt.PeerIPv4, "127.0.0.1"}, {nt.PeerIPv6, "::1"}} {
					addr := nt.HostPort(fam.peer, port)
					if mode == "" && direct != "" {
						addr = nt.HostPort(fam.lo, 4140) // the floor: straight to the proxy
					}
					per = append(per, fmt.Sprintf("%.2f", entriesPer(b, w.Pod, network, addr, o, want)))
				}
				return strings.Join(per, " / ")
			}
			proxy := nt.DialOpts{UID: 2102}
			if !dns {
				cols = append(cols, pair("tcp", 80, nt.DialOpts{}, "direct", "proxy 4140"), pair("tcp", 80, proxy, "", "server"),
					pair("udp", 53, nt.DialOpts{}, "", "nameserver"))
				continue
			}
			captured := "dns-proxy"
			if mode == "" {
				captured = "nameserver"
			}
			cols = append(cols, pair("udp", 53, nt.DialOpts{}, "", captured), pair("udp", 53, proxy, "", "nameserver"))
		}
		fmt.Printf("  %-10s %-28s %-30s %-24s %-24s %s\n", name, cols[0], cols[1], cols[2], cols[3], cols[4])
	}
}

// entriesPer makes ctConns connections (or one-datagram queries) from inside n to addr, one after
// another, each answered by whoever's reply starts with want, and returns how many conntrack
// entries each added in n.
func entriesPer(b *testing.B, n *nt.NS, network, addr string, o nt.DialOpts, want string) float64 {
	before := conntrackCount(b, n)
	for i := 0; i < ctConns; i++ {
		if got, err := nt.Dial(b, n, network, addr, o); err != nil || !strings.HasPrefix(got, want) {
			b.Fatalf("%s %s (uid %d): %q, %v; want %q to answer", network, addr, o.UID, got, err, want)
		}
	}
	return float64(conntrackCount(b, n)-before) / ctConns
}

// conntrackCount reads n's own conntrack table size: the sysctl is per network namespace.
func conntrackCount(b *testing.B, n *nt.NS) int {
	var count int
	if err := n.Do(func() error {
		data, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_count")
		if err != nil {
			return err
		}
		count, err = strconv.Atoi(strings.TrimSpace(string(data)))
		return err
	}); err != nil {
		b.Fatal(err)
	}
	return count
}

// slabPods is the kubelet's default pod limit: the namespaces one node's rulesets live in.
const (
	slabPods    = 110
	slabRepeats = 5
)

// meminfoKeys are the kernel's own allocations a ruleset can grow: the slab (rules, sets, chains,
// conntrack's per-namespace state), per-CPU memory (rule counters) and vmalloc (large tables).
var meminfoKeys = []string{"Slab", "SUnreclaim", "Percpu", "VmallocUsed"}

// slabRows prints the kernel memory one pod's ruleset takes: /proc/meminfo read before and after
// applying the chart's ruleset in slabPods fresh namespaces (made before the first read, so the
// namespaces themselves are not counted), divided by slabPods; the median of slabRepeats, with
// their range. The row without rules makes the same namespaces and applies nothing: it is the
// machine's noise (other work allocates and frees slab meanwhile). The largest slab caches' growth
// in the last repeat says where the memory went.
func slabRows(b *testing.B) {
	fmt.Printf("\nKernel memory per pod's ruleset (chart defaults, v4+v6), /proc/meminfo after applying it in %d fresh namespaces "+
		"less before, per pod, median of %d (range); load average %s:\n", slabPods, slabRepeats, loadAverage())
	var slowest time.Duration
	for _, mode := range append(connectionModes(), "") {
		deltas := map[string][]float64{}
		var caches []string
		for r := 0; r < slabRepeats; r++ {
			d, top, took := slabOnce(b, mode, slowest)
			slowest = max(slowest, took)
			for k, v := range d {
				deltas[k] = append(deltas[k], v)
			}
			caches = top
		}
		name := mode
		if mode == "" {
			name = "none (noise)"
		}
		var cols []string
		for _, k := range meminfoKeys {
			v := deltas[k]
			slices.Sort(v)
			cols = append(cols, fmt.Sprintf("%s %+.1f KiB (%+.1f to %+.1f)", k, v[len(v)/2], v[0], v[len(v)-1]))
		}
		fmt.Printf("  %-13s %s\n                largest slab caches' growth per pod: %s\n", name, strings.Join(cols, ", "), strings.Join(caches, ", "))
	}
}

// slabOnce applies mode's ruleset in slabPods fresh namespaces (for "", applies nothing and waits
// idle instead) and returns each meminfoKeys figure's growth per pod in KiB, the four slab caches
// that grew most, and how long the applies took.
func slabOnce(b *testing.B, mode string, idle time.Duration) (map[string]float64, []string, time.Duration) {
	var nss []ns.NetNS
	defer func() {
		for _, n := range nss {
			n.Close()
			testutils.UnmountNS(n)
		}
		// The kernel frees a namespace in a work queue, after RCU grace periods: let the next
		// repeat's first read come after this one's frees.
		time.Sleep(2 * time.Second)
	}()
	for i := 0; i < slabPods; i++ {
		n, err := testutils.NewNS()
		if err != nil {
			b.Fatal(err)
		}
		nss = append(nss, n)
	}
	cfg := chartConfig()
	cfg.Mode = iptables.Mode(mode)
	time.Sleep(time.Second) // the namespaces' own deferred allocations
	before, slabBefore := meminfo(b), slabinfo(b)
	start := time.Now()
	for _, n := range nss {
		if mode != "" {
			applyIn(b, nt.Existing("bench", n.Path()), cfg)
		}
	}
	took := time.Since(start)
	if mode == "" {
		time.Sleep(idle)
	}
	after, slabAfter := meminfo(b), slabinfo(b)
	out := map[string]float64{}
	for _, k := range meminfoKeys {
		out[k] = float64(after[k]-before[k]) / slabPods
	}
	type growth struct {
		name  string
		bytes int64
	}
	var g []growth
	for name, v := range slabAfter {
		g = append(g, growth{name, v - slabBefore[name]})
	}
	slices.SortFunc(g, func(x, y growth) int { return int(y.bytes - x.bytes) })
	var top []string
	for _, c := range g[:min(4, len(g))] {
		top = append(top, fmt.Sprintf("%s %+.1f KiB", c.name, float64(c.bytes)/1024/slabPods))
	}
	return out, top, took
}

// meminfo reads /proc/meminfo's figures in KiB.
func meminfo(b *testing.B) map[string]int64 {
	data, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]int64{}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			out[strings.TrimSuffix(f[0], ":")] = v
		}
	}
	return out
}

// slabinfo reads /proc/slabinfo: the bytes each cache holds (its objects, in use or not), which
// is what the slab's pages hold.
func slabinfo(b *testing.B) map[string]int64 {
	data, err := os.ReadFile("/proc/slabinfo")
	if err != nil {
		b.Fatal(err)
	}
	out := map[string]int64{}
	for _, l := range strings.Split(string(data), "\n") {
		// name <active_objs> <num_objs> <objsize> ...
		f := strings.Fields(l)
		if len(f) < 4 || strings.HasPrefix(l, "#") || f[0] == "slabinfo" {
			continue
		}
		objs, _ := strconv.ParseInt(f[2], 10, 64)
		size, _ := strconv.ParseInt(f[3], 10, 64)
		out[f[0]] += objs * size
	}
	return out
}
