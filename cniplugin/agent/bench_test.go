package agent_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/cnitest"
	"github.com/kubemesh/proxy-init/test/kubetest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// BenchmarkAudit prints, for `make bench` (-benchtime 1x: it repeats by itself), the time of one
// audit pass over 110 meshed pods on one node (the kubelet's default pod limit) and the API
// requests the pass makes, with every pod's rules in place, then with every pod's rules flushed
// (the pass heals them all); then with six more pods, each with a process of its own holding its
// namespace's in-pod lock, and with three of those six held under the host lock (each audit gives
// up after cniplugin.AuditLockWait). The pods' namespaces are found by the test's finder: the
// CRI's part (one list per pod, one status per new sandbox) is not in these figures.
func BenchmarkAudit(b *testing.B) {
	const pods, passes, locked, hostLocked = 110, 5, 6, 3
	c := startCluster(b)
	r := newRig(b, c, rigOpts{})
	want := expected(b, iptables.ModeNFT, nil)
	var all []*pod
	for i := range pods {
		all = append(all, r.addPod(fmt.Sprintf("web-%03d", i), nil))
	}
	// Let the pod events' own audits drain first.
	waitFor(b, "the agent's queue to drain", func() bool { return r.metric("queue_size") == "0" })
	time.Sleep(2 * time.Second)
	requests := func() int {
		evs, err := c.AuditEvents(r.user)
		if err != nil {
			b.Fatal(err)
		}
		return len(evs)
	}
	pass := func() (time.Duration, int) {
		before := requests()
		start := time.Now()
		n := r.a.AuditAll(context.Background()).Audited
		took := time.Since(start)
		if n != pods {
			b.Fatalf("the pass audited %d pods, want %d", n, pods)
		}
		time.Sleep(time.Second) // the audit log is written asynchronously
		return took, requests() - before
	}
	var clean []time.Duration
	cleanRequests := 0
	for range passes {
		d, n := pass()
		clean = append(clean, d)
		cleanRequests += n
	}
	for _, p := range all {
		if _, err := nt.RunIn(b, p.netns, "nft", "flush", "ruleset"); err != nil {
			b.Fatal(err)
		}
	}
	heal, healRequests := pass()
	for _, p := range all {
		if st := show(b, p, want); !st.Match() {
			b.Fatalf("%s not healed", p.obj.Name)
		}
	}
	slices.Sort(clean)
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("\nlinkerd-cni agent audit, %d meshed pods on one node, nft mode, local kube-apiserver (load average %s):\n",
		pods, strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Printf("  %-48s %8s  (%.2fms per pod; %d passes, range %s-%s)  API requests per pass %.1f\n", "one pass, every pod's rules in place",
		msec(clean[len(clean)/2]), float64(clean[len(clean)/2].Microseconds())/1000/pods, passes, msec(clean[0]), msec(clean[len(clean)-1]),
		float64(cleanRequests)/passes)
	fmt.Printf("  %-48s %8s  (%.2fms per pod)  API requests %d (%d Events, one per healed pod)\n", "one pass healing every pod",
		msec(heal), float64(heal.Microseconds())/1000/pods, healRequests, pods)

	var held []*pod
	for i := range locked {
		p := r.addPod(fmt.Sprintf("locked-%d", i), nil)
		holdInPodLock(b, p)
		held = append(held, p)
	}
	inPod := r.a.AuditAll(context.Background())
	if inPod.Audited != pods+locked || inPod.Busy != 0 {
		b.Fatalf("with %d in-pod locks held: %+v", locked, inPod)
	}
	fmt.Printf("  %-48s %8s  (%d pods audited, %d busy)\n", fmt.Sprintf("one pass, +%d pods holding their in-pod lock", locked),
		msec(inPod.Took), inPod.Audited, inPod.Busy)
	for _, p := range held[:hostLocked] {
		r.holdHostLock(p)
	}
	host := r.a.AuditAll(context.Background())
	if host.Audited != pods+locked-hostLocked || host.Busy != hostLocked {
		b.Fatalf("with %d host locks held: %+v", hostLocked, host)
	}
	fmt.Printf("  %-48s %8s  (the other %d pods audited within %s; %d busy, %s wait each)\n", fmt.Sprintf("one pass, %d of those under the host lock", hostLocked),
		msec(host.Took), host.Audited, msec(host.LastAudited), host.Busy, cniplugin.AuditLockWait)
}

// BenchmarkFootprint prints, for `make bench`, the size of the DaemonSet binary (linkerd-cni
// built as `make build` builds it: static and stripped) and the steady memory of a real
// `linkerd-cni agent` process watching a node with 110 meshed pods (the kubelet's default pod
// limit), with the chart's RBAC, lookups served, audits off (they would need a CRI). With
// $PROXY_INIT_BENCH_BASELINE naming another build's proxy-init, that build's linkerd-cni beside it
// (as `make build` puts them) is measured in the same run.
func BenchmarkFootprint(b *testing.B) {
	const pods = 110
	bin := filepath.Join(b.TempDir(), "linkerd-cni")
	if err := cnitest.GoBuild(filepath.Dir(bin), "github.com/kubemesh/proxy-init/cmd/linkerd-cni"); err != nil {
		b.Fatal(err)
	}
	bins := []string{bin}
	if old := os.Getenv("PROXY_INIT_BENCH_BASELINE"); old != "" {
		bins = append(bins, filepath.Join(filepath.Dir(old), "linkerd-cni"))
	}

	c := startCluster(b)
	const node, ns = "node-footprint", "footprint"
	ctx := context.Background()
	if _, err := c.Clientset.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		b.Fatal(err)
	}
	for i := range pods {
		createMeshedPod(b, c, ns, fmt.Sprintf("web-%03d", i), node)
	}
	token := chartServiceAccount(b, c, "footprint", nil)
	kubeconfig := filepath.Join(b.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, token); err != nil {
		b.Fatal(err)
	}

	type footprint struct{ size, rss, hwm int64 }
	var got []footprint
	for _, bin := range bins {
		fi, err := os.Stat(bin)
		if err != nil {
			b.Fatal(err)
		}
		rss, hwm := agentMemory(b, c, bin, kubeconfig, node)
		got = append(got, footprint{fi.Size(), rss, hwm})
	}
	mb := func(n int64) string { return fmt.Sprintf("%.1fMB", float64(n)/1e6) }
	against := func(f func(footprint) int64) string {
		if len(got) == 1 {
			return ""
		}
		return fmt.Sprintf("  baseline %s: %.2fx", mb(f(got[1])), float64(f(got[0]))/float64(f(got[1])))
	}
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("\nlinkerd-cni DaemonSet binary (%s/%s) and its agent, %d meshed pods on the node, local kube-apiserver (load average %s):\n",
		runtime.GOOS, runtime.GOARCH, pods, strings.Join(strings.Fields(string(load))[:3], " "))
	if len(bins) > 1 {
		fmt.Printf("  (baseline: %s)\n", bins[1])
	}
	size := func(f footprint) int64 { return f.size }
	fmt.Printf("  %-48s %8s  (target <= 30MB: %s)%s\n", "binary size (static, stripped)", mb(got[0].size),
		map[bool]string{true: "met", false: "MISSED"}[got[0].size <= 30e6], against(size))
	rss := func(f footprint) int64 { return f.rss }
	fmt.Printf("  %-48s %8s  (peak VmHWM %s)%s\n", "agent's steady RSS (VmRSS, ready + 5s)", mb(got[0].rss), mb(got[0].hwm), against(rss))
}

// createMeshedPod creates a meshed pod on node, reported running as a kubelet would.
func createMeshedPod(b *testing.B, c *kubetest.Cluster, ns, name, node string) {
	b.Helper()
	ctx := context.Background()
	pod, err := c.Clientset.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{agent.ControlPlaneNSLabel: "linkerd"},
			Annotations: map[string]string{"linkerd.io/inject": "enabled", "linkerd.io/proxy-version": "edge-26.1.1"}},
		Spec: corev1.PodSpec{NodeName: node,
			InitContainers: []corev1.Container{{Name: agent.ValidatorContainer, Image: "proxy-init:test"}},
			Containers:     []corev1.Container{{Name: "app", Image: "app:test"}, {Name: "linkerd-proxy", Image: "proxy:test"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		b.Fatal(err)
	}
	pod.Status.Phase = corev1.PodRunning
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue}}
	if _, err := c.Clientset.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		b.Fatal(err)
	}
}

// agentMemory runs bin's agent in the cluster's network namespace until it is ready and has
// settled, and returns its VmRSS and VmHWM in bytes.
func agentMemory(b *testing.B, c *kubetest.Cluster, bin, kubeconfig, node string) (rss, hwm int64) {
	b.Helper()
	dir := b.TempDir()
	cmd := exec.Command(bin, "agent", "--node-name", node, "--kubeconfig", kubeconfig, "--audit-period", "0",
		"--socket", filepath.Join(dir, "run", "agent.sock"), "--plugin-logs=false", "--admin-addr", "127.0.0.1:0")
	var stderr cnitest.SyncBuffer
	cmd.Stderr = &stderr
	if err := netnsutil.Do(c.NetNSPath, cmd.Start); err != nil {
		b.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	deadline := time.Now().Add(waitLong)
	for !strings.Contains(stderr.String(), "agent ready") {
		if time.Now().After(deadline) {
			b.Fatalf("%s agent not ready:\n%s", bin, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(5 * time.Second) // past the start-up's garbage
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", cmd.Process.Pid))
	if err != nil {
		b.Fatal(err)
	}
	field := func(name string) int64 {
		for line := range strings.Lines(string(status)) {
			if f := strings.Fields(line); len(f) == 3 && f[0] == name+":" && f[2] == "kB" {
				kb, err := strconv.ParseInt(f[1], 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				return kb << 10
			}
		}
		b.Fatalf("no %s in /proc/%d/status", name, cmd.Process.Pid)
		return 0
	}
	return field("VmRSS"), field("VmHWM")
}

func msec(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
