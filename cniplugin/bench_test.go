package cniplugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/cnitest"
)

// benchRuns is how many times each measurement is repeated; medians are reported.
const benchRuns = 31

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func msec(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }

// BenchmarkADD prints linkerd-cni's figures for `make bench` (-benchtime 1x: it repeats by itself):
// the median ADD latency of a meshed pod through libcni with the local kube-apiserver, beside the
// same chain with a no-op plugin in linkerd-cni's place, with the node agent writing (route 1, as
// the chart's agent with audits does), with an agent of lookups only (route 2: the plugin writes
// with its lookup, as with agent.auditPeriod 0s) and without one (the plugin reads the API
// itself); the ADD with the agent with the binaries run directly, without libcni and the bridge,
// beside the no-op plugin run the same way; the start-up time (CNI_COMMAND=VERSION) of the plugin beside start-up floors (the no-op
// plugin alone, and with Go's HTTPS stack); the binary's size; and the peak memory of an ADD.
func BenchmarkADD(b *testing.B) {
	n := newNode(b, true)
	stateOnTmpfs(b, filepath.Join(n.dir, "state"))
	// The start-ups first, before the ADDs below leave the kernel tearing down hundreds of
	// namespaces. They take turns too, many more of them: they differ by a fraction of a
	// millisecond.
	startBins := []string{filepath.Join(binDirs[0], "linkerd-cni"), filepath.Join(binDirs[0], "noopcni"), floorPlugin(b, "linkhttps")}
	basePlugins := baselinePlugins(b)
	if basePlugins != "" {
		startBins = append(startBins, filepath.Join(basePlugins, "linkerd-cni"))
	}
	starts := startups(b, startBins...)
	n.createNamespace(b, "bench", nil)
	n.createPod(b, "bench", "web", shapeClassic, nil, nil)
	n.createPod(b, "bench", "plain", shapeUnmeshed, nil, nil)

	// addOnce returns the wall time of AddNetworkList for a fresh sandbox (with a user namespace of
	// its own when userns), and its container ID. Sandbox creation, loopback and the DEL afterwards
	// are not timed.
	addOnce := func(cni *libcni.CNIConfig, list *libcni.NetworkConfigList, pod string, userns bool) (time.Duration, string) {
		if cni == nil {
			cni = n.cni
		}
		newSandbox := n.newSandbox
		if userns {
			newSandbox = n.newUserNSSandbox
		}
		sb := newSandbox(b, "bench", pod)
		var took time.Duration
		err := n.inNode(func(ctx context.Context) error {
			lo := *sb.rt
			lo.IfName = "lo"
			if _, err := cni.AddNetwork(ctx, loopbackConf, &lo); err != nil {
				return err
			}
			start := time.Now()
			_, err := cni.AddNetworkList(ctx, list, sb.rt)
			took = time.Since(start)
			if err != nil {
				return err
			}
			return cni.DelNetworkList(ctx, list, sb.rt)
		})
		if err != nil {
			b.Fatalf("ADD: %v\n%s", err, n.logTail(sb.rt.ContainerID))
		}
		sb.remove(b)
		return took, sb.rt.ContainerID
	}
	socket, _, _ := n.startAgent(b)
	floorSocket := echoServer(b)
	none := map[string]any{"log_level": "info", "agent": map[string]any{"socket": ""}}
	withAgent := map[string]any{"log_level": "info", "agent": map[string]any{"socket": socket}}
	// Agents that write (route 1), one per mode: each reads its node's conflist, the row's.
	writers := map[iptables.Mode]map[string]any{}
	for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeAuto} {
		s, dir := n.startWritingAgent(b)
		writers[mode] = map[string]any{"log_level": "info", "agent": map[string]any{"socket": s}}
		writeNodeConflist(b, dir, n.conflist(b, netOpts{mode: mode, top: writers[mode]}))
	}
	type addRow struct {
		what  string
		list  *libcni.NetworkConfigList
		pod   string
		limit time.Duration // the target overhead over the no-op plugin; 0 for the references
		// userns: the pod has a user namespace of its own (hostUsers: false).
		userns bool
		// requests is the API requests per ADD in the audit log.
		requests float64
		// cni runs the chain; nil is the node's (this build's plugin).
		cni   *libcni.CNIConfig
		times []time.Duration
		ids   []string
	}
	rows := []*addRow{
		{what: "baseline: no-op chained plugin", list: n.conflist(b, netOpts{noop: true}), pod: "web"},
		{what: "floor: no-op + one UNIX-socket round trip", list: n.conflist(b, netOpts{noop: true, top: map[string]any{"roundtrip": floorSocket}}), pod: "web"},
	}
	for _, c := range []struct {
		what   string
		mode   iptables.Mode
		pod    string
		top    map[string]any
		userns bool // the pod has a user namespace of its own (hostUsers: false)
		limit  time.Duration
	}{
		{"meshed pod, iptables-mode nftables (native)", iptables.ModeNFTables, "web", none, false, 40 * time.Millisecond},
		{"meshed pod, iptables-mode nft (Linkerd chart)", iptables.ModeNFT, "web", none, false, 30 * time.Millisecond},
		{"meshed pod, nft, agent writes (route 1)", iptables.ModeNFT, "web", writers[iptables.ModeNFT], false, 4 * time.Millisecond},
		{"meshed pod, nft, agent lookups only (route 2)", iptables.ModeNFT, "web", withAgent, false, 8 * time.Millisecond},
		{"meshed pod, iptables-mode auto", iptables.ModeAuto, "web", none, false, 30 * time.Millisecond},
		{"meshed pod, auto, agent writes (route 1)", iptables.ModeAuto, "web", writers[iptables.ModeAuto], false, 4 * time.Millisecond},
		{"meshed pod, iptables-mode legacy", iptables.ModeLegacy, "web", none, false, 40 * time.Millisecond},
		{"meshed pod, legacy, agent lookups (route 2)", iptables.ModeLegacy, "web", withAgent, false, 40 * time.Millisecond},
		{"unmeshed pod (one pod GET, no rules)", iptables.ModeNFTables, "plain", none, false, 40 * time.Millisecond},
		{"unmeshed pod, agent ready (route 1)", iptables.ModeNFTables, "plain", writers[iptables.ModeNFT], false, 4 * time.Millisecond},
		{"hostUsers: false, nft (native table)", iptables.ModeNFT, "web", none, true, 40 * time.Millisecond},
		{"hostUsers: false, auto (native table)", iptables.ModeAuto, "web", none, true, 40 * time.Millisecond},
	} {
		rows = append(rows, &addRow{what: c.what, list: n.conflist(b, netOpts{mode: c.mode, top: c.top}), pod: c.pod, userns: c.userns, limit: c.limit})
	}
	// Same-run rows of a baseline build (LINKERD_CNI_BENCH_BASELINE), its plugin through libcni
	// with its own agent, the ratio route 1 is held to, and without an agent, where dd9fffe's
	// plugin ran its companion for the API reads.
	base := n.startBaseline(b, basePlugins)
	var baseRows []*addRow
	if base != nil {
		for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeAuto} {
			top := map[string]any{"log_level": "info", "agent": map[string]any{"socket": base.socket}}
			r := &addRow{what: "baseline build: meshed, " + string(mode) + ", its agent", list: n.conflist(b, netOpts{mode: mode, top: top}), pod: "web", cni: base.cni, limit: 4 * time.Millisecond}
			rows, baseRows = append(rows, r), append(baseRows, r)
		}
		r := &addRow{what: "baseline build: meshed, nft, no agent", list: n.conflist(b, netOpts{mode: iptables.ModeNFT, top: none}), pod: "web", cni: base.cni, limit: 30 * time.Millisecond}
		rows, baseRows = append(rows, r), append(baseRows, r)
	}
	// The API requests each row makes, counted in the audit log over a few ADDs of its own.
	const counted = 3
	for _, r := range rows[2:] {
		before := len(n.apiEvents(b, "bench"))
		for range counted {
			addOnce(r.cni, r.list, r.pod, r.userns)
		}
		time.Sleep(time.Second) // the audit log is written asynchronously
		r.requests = float64(len(n.apiEvents(b, "bench"))-before) / counted
	}
	// The rows take turns, in a new random order each turn, so that a change in the machine's load
	// weighs on all of them alike; each overhead is the median of its differences from the
	// baseline's ADD of the same turn.
	for range benchRuns {
		for _, i := range rand.Perm(len(rows)) {
			r := rows[i]
			d, id := addOnce(r.cni, r.list, r.pod, r.userns)
			r.times, r.ids = append(r.times, d), append(r.ids, id)
		}
	}
	overhead := func(r *addRow) time.Duration { return over(r.times, rows[0].times) }

	bin := filepath.Join(binDirs[0], "linkerd-cni")
	// The agent's path without libcni and the bridge, whose share of an ADD moves by milliseconds
	// on a busy machine: each binary run directly as the runtime runs it, on a fresh sandbox with
	// the chain's prevResult, the binaries taking turns; DEL and the sandbox are not timed.
	list := n.conflist(b, netOpts{mode: iptables.ModeNFTables, top: none})
	sb := n.newSandbox(b, "bench", "web")
	res := n.mustAdd(b, list, sb)
	var prev bytes.Buffer
	if err := res.PrintTo(&prev); err != nil {
		b.Fatal(err)
	}
	type directRow struct {
		what  string
		bin   string
		list  *libcni.NetworkConfigList
		limit time.Duration // the target over the no-op; 0 for the floors
		times []time.Duration
		ids   []string
	}
	chartNFT := rows[slices.IndexFunc(rows, func(r *addRow) bool { return r.what == "meshed pod, iptables-mode nft (Linkerd chart)" })]
	direct := []directRow{
		{what: "floor: the no-op plugin", bin: filepath.Join(binDirs[0], "noopcni"), list: rows[0].list},
		{what: "floor: no-op + one UNIX-socket round trip", bin: filepath.Join(binDirs[0], "noopcni"), list: rows[1].list},
		{what: "linkerd-cni, meshed, nft, agent writes (1)", bin: bin, list: n.conflist(b, netOpts{mode: iptables.ModeNFT, top: writers[iptables.ModeNFT]}), limit: 4 * time.Millisecond},
		{what: "linkerd-cni, meshed, nft, agent lookups (2)", bin: bin, list: n.conflist(b, netOpts{mode: iptables.ModeNFT, top: withAgent}), limit: 4 * time.Millisecond},
		{what: "linkerd-cni, meshed, auto, agent writes (1)", bin: bin, list: n.conflist(b, netOpts{mode: iptables.ModeAuto, top: writers[iptables.ModeAuto]}), limit: 4 * time.Millisecond},
		{what: "linkerd-cni, meshed, nft, no agent", bin: bin, list: chartNFT.list, limit: chartNFT.limit},
	}
	if base != nil {
		direct = append(direct, directRow{what: "baseline build, meshed, nft, its agent", bin: base.plugin, list: baseRows[0].list, limit: 4 * time.Millisecond},
			directRow{what: "baseline build, meshed, nft, no agent", bin: base.plugin, list: baseRows[2].list, limit: baseRows[2].limit})
	}
	for range directRuns {
		for _, i := range rand.Perm(len(direct)) {
			d := &direct[i]
			fresh := n.newSandbox(b, "bench", "web")
			env, stdin := sandboxEnv(fresh), pluginStdin(b, d.list, prev.Bytes())
			if err := n.inNode(func(context.Context) error {
				d.times, d.ids = append(d.times, runOnce(b, d.bin, "ADD", env, stdin)), append(d.ids, fresh.rt.ContainerID)
				runOnce(b, d.bin, "DEL", env, stdin)
				return nil
			}); err != nil {
				b.Fatal(err)
			}
			fresh.remove(b)
		}
	}

	// Peak memory of a real ADD: run the binary directly, as libcni would, on a wired sandbox.
	var addRSS int64
	if err := n.inNode(func(context.Context) error {
		addRSS = peakRSS(b, bin, "ADD", sandboxEnv(sb), pluginStdin(b, list, prev.Bytes()))
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	versionRSS := peakRSS(b, bin, "VERSION", nil, nil)
	size := func(path string) float64 {
		fi, err := os.Stat(path)
		if err != nil {
			b.Fatal(err)
		}
		return float64(fi.Size()) / (1 << 20)
	}

	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("\nlinkerd-cni ADD through libcni, chain [bridge+host-local, plugin], local kube-apiserver, median of %d, the rows taking turns in random order (load average %s):\n",
		benchRuns, strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Printf("  %-48s %8s\n", rows[0].what, msec(median(rows[0].times)))
	fmt.Printf("  %-48s %8s  overhead %8s\n", rows[1].what, msec(median(rows[1].times)), msec(overhead(rows[1])))
	for _, r := range rows[2:] {
		fmt.Printf("  %-48s %8s  overhead %8s  (target <= %s: %s)  API requests per ADD %.1f\n", r.what, msec(median(r.times)), msec(overhead(r)), r.limit, meets(overhead(r), r.limit), r.requests)
		fmt.Printf("  %-48s %s\n", "", n.insideTimes(b, r.ids)+"; the rest is process start-up and libcni")
	}
	fmt.Printf("  ADD run directly (no libcni, no bridge), fresh sandbox, median of %d, the binaries taking turns in random order; over the no-op: the median of the differences of the same turn:\n", directRuns)
	noopTimes := direct[0].times
	fmt.Printf("    %-46s %8s\n", direct[0].what, msec(median(noopTimes)))
	fmt.Printf("    %-46s %8s  %+.2fms over the no-op\n", direct[1].what, msec(median(direct[1].times)), ms(over(direct[1].times, noopTimes)))
	for _, d := range direct[2:] {
		o := over(d.times, noopTimes)
		fmt.Printf("    %-46s %8s  %+.2fms over the no-op (target <= %s: %s)\n", d.what, msec(median(d.times)), ms(o), d.limit, meets(o, d.limit))
		fmt.Printf("    %-46s %s\n", "", n.insideTimes(b, d.ids)+"; the rest is the plugin's process")
	}
	if base != nil {
		// The ratios of route 1 to the baseline build's agent path, same run (target <= 1.05).
		ratio := func(a, b time.Duration) string {
			if b <= 0 {
				return "n/a (the baseline's overhead is not positive)"
			}
			return fmt.Sprintf("%.2fx", float64(a)/float64(b))
		}
		byWhat := map[string]*addRow{}
		for _, r := range rows {
			byWhat[r.what] = r
		}
		fmt.Printf("  route 1 against the baseline build (%s), same run, target <= 1.05x:\n", base.dir)
		fmt.Printf("    %-46s overhead %s\n", "through libcni, nft", ratio(overhead(byWhat["meshed pod, nft, agent writes (route 1)"]), overhead(baseRows[0])))
		fmt.Printf("    %-46s overhead %s\n", "through libcni, auto", ratio(overhead(byWhat["meshed pod, auto, agent writes (route 1)"]), overhead(baseRows[1])))
		ours, theirs := direct[2], direct[len(direct)-2]
		fmt.Printf("    %-46s over the no-op %s (whole ADD %s)\n", "run directly, nft", ratio(over(ours.times, noopTimes), over(theirs.times, noopTimes)),
			ratio(median(ours.times), median(theirs.times)))
		fmt.Printf("  without an agent (the plugin reads the API) against the baseline build's companion path, same run, target <= 0.75x:\n")
		fmt.Printf("    %-46s overhead %s\n", "through libcni, nft", ratio(overhead(chartNFT), overhead(baseRows[2])))
		ours, theirs = direct[5], direct[len(direct)-1]
		fmt.Printf("    %-46s over the no-op %s (whole ADD %s)\n", "run directly, nft", ratio(over(ours.times, noopTimes), over(theirs.times, noopTimes)),
			ratio(median(ours.times), median(theirs.times)))
	}
	fmt.Printf("  start-up, CNI_COMMAND=VERSION, median of %d at real-time priority, the binaries taking turns in random order; over the no-op: the median of the differences of the same turn:\n", startupRuns)
	startup, startupOver := median(starts[0]), over(starts[0], starts[1])
	fmt.Printf("    %-46s %8s  %+.2fms over the no-op (target <= 10ms: %s; <= 0.5ms over the no-op: %s)\n", "linkerd-cni, the plugin", msec(startup),
		ms(startupOver), meets(startup, 10*time.Millisecond), meets(startupOver, 500*time.Microsecond))
	fmt.Printf("    %-46s %8s\n", "floor: the no-op plugin", msec(median(starts[1])))
	fmt.Printf("    %-46s %8s  %+.2fms over the no-op (what any plugin that reads the API links)\n", "floor: no-op plugin + net/http and crypto/tls",
		msec(median(starts[2])), ms(over(starts[2], starts[1])))
	if len(starts) > 3 {
		fmt.Printf("    %-46s %8s  %+.2fms over the no-op (its API reads were another binary's)\n", "baseline build's plugin", msec(median(starts[3])), ms(over(starts[3], starts[1])))
	}
	fmt.Printf("  %-48s %6.1fMB\n", "binary size (static, stripped)", size(bin))
	fmt.Printf("  %-48s %6.1fMB  (VERSION: %.1fMB)\n", "peak RSS of a meshed ADD read from the API", float64(addRSS)/1024, float64(versionRSS)/1024)
}

// stateOnTmpfs mounts a tmpfs at dir, the nodes' state-dir: on a node it is under /var/run, a
// tmpfs, where each ADD creates its lock file and record. Here the temporary directory is on the
// machine's disk, where ext4 takes 0.3 to 0.5 ms to allocate each new inode once many files have
// come and gone (its recently_deleted scan), a cost no node pays and the baseline build, which
// created no files, did not either.
func stateOnTmpfs(b *testing.B, dir string) {
	b.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755"); err != nil {
		b.Fatalf("mount a tmpfs at %s: %v", dir, err)
	}
	b.Cleanup(func() {
		if err := unix.Unmount(dir, unix.MNT_DETACH); err != nil {
			b.Errorf("unmount %s: %v", dir, err)
		}
	})
}

// echoServer answers every message on a SOCK_SEQPACKET socket with a short one: the other end of
// the round-trip floor.
func echoServer(b *testing.B) string {
	b.Helper()
	dir, err := os.MkdirTemp("", "echo-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "echo.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 64<<10)
				if _, err := c.Read(buf); err == nil {
					_, _ = c.Write([]byte(`{"v":2}`))
				}
			}()
		}
	}()
	return path
}

// floorPlugin builds the no-op plugin with one of its link tags (see test/noopcni)
// and returns the binary: a start-up reference that initialises a dependency and does nothing else.
func floorPlugin(b *testing.B, tag string) string {
	b.Helper()
	dir := b.TempDir()
	if err := cnitest.GoBuild(dir, "-tags="+tag, "github.com/kubemesh/proxy-init/test/noopcni"); err != nil {
		b.Fatal(err)
	}
	return filepath.Join(dir, "noopcni")
}

// directRuns is how many times each binary's direct ADD is measured.
const directRuns = 81

// pluginStdin is the config the runtime gives the last plugin of list: its entry, the list's
// name and version, and prevResult.
func pluginStdin(b *testing.B, list *libcni.NetworkConfigList, prevResult []byte) []byte {
	b.Helper()
	conf := map[string]any{}
	if err := json.Unmarshal(list.Plugins[len(list.Plugins)-1].Bytes, &conf); err != nil {
		b.Fatal(err)
	}
	conf["cniVersion"], conf["name"] = list.CNIVersion, list.Name
	conf["prevResult"] = json.RawMessage(prevResult)
	stdin, err := json.Marshal(conf)
	if err != nil {
		b.Fatal(err)
	}
	return stdin
}

// sandboxEnv is the CNI environment of an ADD on eth0 of the sandbox.
func sandboxEnv(sb *sandbox) []string {
	return []string{"CNI_CONTAINERID=" + sb.rt.ContainerID, "CNI_NETNS=" + sb.rt.NetNS, "CNI_IFNAME=eth0",
		"CNI_ARGS=K8S_POD_NAMESPACE=bench;K8S_POD_NAME=web", "CNI_PATH=" + strings.Join(binDirs, ":")}
}

// startupRuns is how many times each binary's start-up is measured.
const startupRuns = 501

// startups returns the wall times of CNI_COMMAND=VERSION of each binary, startupRuns of them,
// the binaries taking turns in a new random order each turn: in a fixed order, a binary's place
// in the turn moved its median by 0.1 to 0.2 ms on this machine.
func startups(b *testing.B, bins ...string) [][]time.Duration {
	b.Helper()
	// A start-up differs from the floors by a fraction of a millisecond, less than one burst of
	// the kube-apiserver, etcd and agents this benchmark runs on the same cores. So the binaries
	// start at real-time priority (SCHED_FIFO, which the child inherits from the thread that
	// forks it), with no pipes to drain, and nothing else on the machine lands in one binary's
	// samples and not another's.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	fifo := &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_FIFO, Priority: 1}
	if err := unix.SchedSetAttr(0, fifo, 0); err != nil {
		b.Fatalf("run at real-time priority: %v", err)
	}
	defer func() {
		if err := unix.SchedSetAttr(0, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: unix.SCHED_NORMAL}, 0); err != nil {
			b.Fatalf("leave real-time priority: %v", err)
		}
	}()
	times := make([][]time.Duration, len(bins))
	for range startupRuns {
		for _, i := range rand.Perm(len(bins)) {
			bin := bins[i]
			c := exec.Command(bin)
			c.Env = []string{"CNI_COMMAND=VERSION"}
			start := time.Now()
			err := c.Run()
			times[i] = append(times[i], time.Since(start))
			if err != nil {
				runOnce(b, bin, "VERSION", nil, nil) // fails the benchmark with the binary's output
				b.Fatalf("%s CNI_COMMAND=VERSION: %v", bin, err)
			}
		}
	}
	return times
}

// over is the median of the differences between a and floor, turn by turn: what a takes over the
// floor, with whatever the machine did during one turn weighing on both alike.
func over(a, floor []time.Duration) time.Duration {
	d := make([]time.Duration, len(a))
	for i := range a {
		d[i] = a[i] - floor[i]
	}
	return median(d)
}

// meets is the verdict on a figure against its target.
func meets(d, target time.Duration) string {
	if d > target {
		return "MISSES"
	}
	return "meets"
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// runOnce runs the plugin binary once with CNI_COMMAND=cmd and returns its wall time.
func runOnce(b *testing.B, bin, cmd string, env []string, stdin []byte) time.Duration {
	b.Helper()
	c := exec.Command(bin)
	c.Env = append([]string{"CNI_COMMAND=" + cmd, "PATH=" + os.Getenv("PATH")}, env...)
	c.Stdin = bytes.NewReader(stdin)
	var out, errOut bytes.Buffer
	c.Stdout, c.Stderr = &out, &errOut
	start := time.Now()
	err := c.Run()
	took := time.Since(start)
	if err != nil {
		b.Fatalf("%s CNI_COMMAND=%s: %v\n%s%s", bin, cmd, err, out.String(), errOut.String())
	}
	return took
}

// peakRSS returns the plugin's peak resident memory in KiB, from the rusage of a grandchild
// started with fork by /usr/bin/time. The rusage of a direct child is useless here: Go starts
// children with vfork, and Linux carries the parent's (the test binary's) high-water mark across
// that exec.
func peakRSS(b *testing.B, bin, cmd string, env []string, stdin []byte) int64 {
	b.Helper()
	out := filepath.Join(b.TempDir(), "rss")
	c := exec.Command("/usr/bin/time", "-f", "%M", "-o", out, bin)
	c.Env = append([]string{"CNI_COMMAND=" + cmd, "PATH=" + os.Getenv("PATH")}, env...)
	c.Stdin = bytes.NewReader(stdin)
	if msg, err := c.CombinedOutput(); err != nil {
		b.Logf("peak memory not measured: /usr/bin/time %s: %v: %s", bin, err, msg)
		return 0
	}
	raw, err := os.ReadFile(out)
	if err != nil {
		b.Fatal(err)
	}
	kib, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	if err != nil {
		b.Fatalf("/usr/bin/time output %q: %v", raw, err)
	}
	return kib
}

// insideTimes summarizes the plugin's own log lines for the given ADDs: the median time of the
// pod lookup, of writing the rules, of the agent's write (route 1: the round trip), and of the
// whole plugin after start-up.
func (n *node) insideTimes(b *testing.B, ids []string) string {
	b.Helper()
	data, err := os.ReadFile(n.logFile)
	if err != nil {
		b.Fatal(err)
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	fields := map[string][]time.Duration{}
	re := regexp.MustCompile(` (lookup|apply|agent|in_agent|elapsed)=(\S+)`)
	idRe := regexp.MustCompile(` container_id=(\S+)`)
	for _, l := range strings.Split(string(data), "\n") {
		m := idRe.FindStringSubmatch(l)
		if m == nil || !want[m[1]] || !(strings.Contains(l, `msg="rules written"`) || strings.Contains(l, `msg="no rules needed"`)) {
			continue
		}
		for _, f := range re.FindAllStringSubmatch(l, -1) {
			if d, err := time.ParseDuration(f[2]); err == nil {
				fields[f[1]] = append(fields[f[1]], d)
			}
		}
	}
	var parts []string
	for _, k := range []string{"lookup", "apply", "agent", "in_agent", "elapsed"} {
		if len(fields[k]) > 0 {
			parts = append(parts, k+" "+msec(median(fields[k])))
		}
	}
	return "inside the plugin (medians): " + strings.Join(parts, ", ")
}

// baseline is another build's plugin and agent (LINKERD_CNI_BENCH_BASELINE names the directory of
// its `make build`: linkerd-cni, and plugin/linkerd-cni), the agent run as a process of its own
// in the node's network namespace, lookups and writes, no audits.
type baseline struct {
	dir, socket, plugin string
	cni                 *libcni.CNIConfig
}

// baselinePlugins copies the baseline build's plugin directory into a new one as the installer
// copies the plugin onto a node (cnitest.CopyAsInstalled), as this build's are, and returns it; ""
// without LINKERD_CNI_BENCH_BASELINE.
func baselinePlugins(b *testing.B) string {
	b.Helper()
	dir := os.Getenv("LINKERD_CNI_BENCH_BASELINE")
	if dir == "" {
		return ""
	}
	out := b.TempDir()
	files, err := os.ReadDir(filepath.Join(dir, "plugin"))
	for _, f := range files {
		if err == nil {
			err = cnitest.CopyAsInstalled(filepath.Join(dir, "plugin", f.Name()), filepath.Join(out, f.Name()))
		}
	}
	if err != nil {
		b.Fatalf("copy the baseline build's plugins: %v", err)
	}
	return out
}

// startBaseline starts the baseline build's agent, its plugins in plugins (baselinePlugins), or
// returns nil without the variable.
func (n *node) startBaseline(b *testing.B, plugins string) *baseline {
	b.Helper()
	dir := os.Getenv("LINKERD_CNI_BENCH_BASELINE")
	if dir == "" {
		return nil
	}
	sockDir, err := os.MkdirTemp("", "baseline-agent-")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(sockDir) })
	base := &baseline{dir: dir, socket: filepath.Join(sockDir, "run", "agent.sock"), plugin: filepath.Join(plugins, "linkerd-cni"),
		// Its plugins' stderr is dropped: the figures, not the baseline's log lines.
		cni: libcni.NewCNIConfigWithCacheDir(append([]string{plugins}, binDirs...), filepath.Join(n.dir, "cache"),
			&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: io.Discard}})}
	var log cnitest.SyncBuffer
	cmd := exec.Command("nsenter", "--net="+n.ns.Path(), "--", filepath.Join(dir, "linkerd-cni"), "agent", "--node-name="+nodeName,
		"--kubeconfig="+n.kubeconfig, "--socket="+base.socket, "--audit-period=0", "--admin-addr=127.0.0.1:19993", "--host-proc=/proc",
		"--plugin-logs=false", "--log-level=warn")
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(time.Minute)
	for {
		if _, err := os.Stat(base.socket); err == nil {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("the baseline agent never listened on %s:\n%s", base.socket, log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // its watches sync; a row's counted ADDs warm it up
	return base
}
