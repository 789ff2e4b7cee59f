//go:build e2e && e2ebench

package e2e

import (
	"context"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/test/kubetest"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// maxPods is the kubelet's default pod limit, which the e2e kubelets keep.
const maxPods = 110

// TestE2EBench (`make e2e-bench`) fills node A to the kubelet's limit of 110 pods with meshed
// pods created at once, counting the pods already there, then deletes them, and does the same
// without the plugin: meshed as a cluster without linkerd-cni meshes them, by the proxy-init
// init container (deploy/examples/proxy-init-workload.yaml), and, for reference, with no init
// container at all and with a stand-in init container that exits at once. It prints the plugin's ADD times through the agent, creation to Ready
// with and without the plugin, validator failures and heals, the agent's peak RSS and CPU
// time, and the API requests of the node's components. Figures are printed, not asserted, but
// for validator failures and heals, which must be 0.
func TestE2EBench(t *testing.T) {
	netnstest.RequireRoot(t)
	RemoveStaleNodes(t)
	c := startE2ECluster(t)
	ctx := context.Background()
	a := c.A()
	ds := installDaemonSet(ctx, t, c)[0]

	_, d := workload(t, "deploy/examples/cni-workload.yaml", "", 1)
	spec := d.Spec.Template
	pin(&spec.Spec, a)
	there, err := c.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + a.Name})
	if err != nil {
		t.Fatal(err)
	}
	count := maxPods - len(there.Items)

	all := func() []kubetest.AuditEvent {
		evs, err := c.Control.AuditEvents("")
		if err != nil {
			t.Fatal(err)
		}
		return evs
	}
	auditBefore := len(all())
	began := time.Now()
	meshed := startBatch(ctx, t, c, "e2e-bench-meshed", spec, count)
	validatorFailures := 0
	for _, p := range meshed.pods {
		for _, cs := range p.Status.InitContainerStatuses {
			if cs.Name == "linkerd-network-validator" && (cs.RestartCount > 0 || exitCode(p, cs.Name) != 0) {
				validatorFailures++
			}
		}
	}
	heals := 0
	for _, p := range meshed.pods {
		for _, e := range agentEvents(ctx, t, c, p.Namespace, p.UID) {
			if e.Reason == "RedirectRepaired" {
				heals++
			}
		}
	}
	deleteNamespace(ctx, t, c.Client, "e2e-bench-meshed")
	took := time.Since(began)
	time.Sleep(2 * time.Second) // the audit log is written after each response
	requests := requestsByClient(all()[auditBefore:])
	adds := addTimes(t, podLog(t, c, ds, agentContainer), "e2e-bench-meshed")
	rss, cpu := agentUsage(ctx, t, c, ds)

	removeDaemonSet(ctx, t, c)
	plain := startBatch(ctx, t, c, "e2e-bench-baseline", withoutValidator(spec), count)
	deleteNamespace(ctx, t, c.Client, "e2e-bench-baseline")
	// The validator is one more container per pod, which the node starts whatever the plugin
	// costs: a stand-in that exits 0 at once (the same image) separates the two.
	standIn := *spec.DeepCopy()
	for i := range standIn.Spec.InitContainers {
		if ic := &standIn.Spec.InitContainers[i]; ic.Name == "linkerd-network-validator" {
			ic.Command, ic.Args = []string{ic.Command[0], "--help"}, nil // exit 0 (cmd/proxy-init's TestLinkerdNames)
		}
	}
	initOnly := startBatch(ctx, t, c, "e2e-bench-init", standIn, count)
	deleteNamespace(ctx, t, c.Client, "e2e-bench-init")
	// Without the plugin, a meshed pod gets its rules from the proxy-init init container.
	_, withInit := workload(t, "deploy/examples/proxy-init-workload.yaml", "", 1)
	initSpec := withInit.Spec.Template
	pin(&initSpec.Spec, a)
	proxyInit := startBatch(ctx, t, c, "e2e-bench-proxy-init", initSpec, count)
	deleteNamespace(ctx, t, c.Client, "e2e-bench-proxy-init")

	p := func(d []time.Duration, q float64) time.Duration {
		if len(d) == 0 {
			return 0
		}
		s := slices.Clone(d)
		slices.Sort(s)
		return s[min(len(s)-1, int(q*float64(len(s))))]
	}
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	sec := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	t.Logf("e2e-bench on %s: node %s filled to %d pods (%d of ours, %d already there), created at once, then deleted",
		c.Runtime.Name, a.Name, maxPods, count, len(there.Items))
	t.Logf("  ADD through the agent (the plugin's elapsed, %d ADDs): p50 %s, p99 %s", len(adds), ms(p(adds, 0.5)), ms(p(adds, 0.99)))
	t.Logf("  creation to Ready with linkerd-cni:    p50 %s, p99 %s (all Ready after %s)", sec(p(meshed.ready, 0.5)), sec(p(meshed.ready, 0.99)), sec(meshed.all))
	t.Logf("  creation to Ready without the plugin, meshed by the proxy-init init container: p50 %s, p99 %s (all Ready after %s)", sec(p(proxyInit.ready, 0.5)), sec(p(proxyInit.ready, 0.99)), sec(proxyInit.all))
	t.Logf("  creation to Ready without the plugin, no init container: p50 %s, p99 %s (all Ready after %s)", sec(p(plain.ready, 0.5)), sec(p(plain.ready, 0.99)), sec(plain.all))
	t.Logf("  creation to Ready without the plugin, a stand-in init container that exits 0: p50 %s, p99 %s (all Ready after %s)", sec(p(initOnly.ready, 0.5)), sec(p(initOnly.ready, 0.99)), sec(initOnly.all))
	for _, b := range []struct {
		name string
		b    batch
	}{{"with linkerd-cni", meshed}, {"meshed by proxy-init", proxyInit}, {"no init container", plain}, {"the stand-in", initOnly}} {
		t.Logf("  phases, %s: %s", b.name, phases(b.b))
	}
	ratio := func(b batch) float64 { return float64(p(meshed.ready, 0.99)) / float64(p(b.ready, 0.99)) }
	t.Logf("  p99 ratio with the plugin / meshed by proxy-init: %.2fx (target 1.10x); / no init container: %.2fx; / the stand-in: %.2fx",
		ratio(proxyInit), ratio(plain), ratio(initOnly))
	t.Logf("  validator failures %d, heals %d (both must be 0)", validatorFailures, heals)
	t.Logf("  agent on %s: peak RSS %d MiB, CPU %.2f s since it started", a.Name, rss>>20, cpu)
	t.Logf("  API requests over the meshed batch (%s, creation to deletion), by client (user agent, user, source address):\n%s",
		sec(took), requests)
	if validatorFailures != 0 || heals != 0 {
		t.Errorf("validator failures %d and heals %d, want 0 and 0: a pod started without its rules", validatorFailures, heals)
	}
}

// phases splits each pod's creation to Ready at its status conditions, which the kubelet stamps
// to the second: to its sandbox and network (PodReadyToStartContainers, where the CNI ADD runs),
// to its init containers' end (Initialized), and to Ready. It prints p50/p99 of each, so a
// difference between batches shows in the phase it comes from.
func phases(b batch) string {
	var sandbox, init, ready []time.Duration
	for _, p := range b.pods {
		at := map[corev1.PodConditionType]time.Time{}
		for _, c := range p.Status.Conditions {
			at[c.Type] = c.LastTransitionTime.Time
		}
		created := p.CreationTimestamp.Time
		sandbox = append(sandbox, at[corev1.PodReadyToStartContainers].Sub(created))
		init = append(init, at[corev1.PodInitialized].Sub(at[corev1.PodReadyToStartContainers]))
		ready = append(ready, at[corev1.PodReady].Sub(at[corev1.PodInitialized]))
	}
	q := func(d []time.Duration) string {
		s := slices.Clone(d)
		slices.Sort(s)
		return fmt.Sprintf("%s/%s", s[len(s)/2].Round(time.Second), s[min(len(s)-1, len(s)*99/100)].Round(time.Second))
	}
	return fmt.Sprintf("to sandbox ready %s, to initialized %s, to Ready %s (p50/p99)", q(sandbox), q(init), q(ready))
}

// userAgentVersion matches what varies in a user agent from build to build.
var userAgentVersion = regexp.MustCompile(`/v[0-9][^ ]*| \([^)]*\)| kubernetes/[0-9a-f]+`)

// requestsByClient counts audit events by client, most first, one client a line. The e2e
// cluster's components are one binary (kube-node) with the admin token, so the user agent, which
// names the component, and the source address (127.0.0.1 on node A) tell them apart.
func requestsByClient(evs []kubetest.AuditEvent) string {
	counts := map[string]int{}
	for _, e := range evs {
		src := ""
		if len(e.SourceIPs) > 0 {
			src = e.SourceIPs[0]
		}
		counts[userAgentVersion.ReplaceAllString(e.UserAgent, "")+", "+e.User.Username+", "+src]++
	}
	keys := slices.SortedFunc(maps.Keys(counts), func(a, b string) int { return counts[b] - counts[a] })
	var out strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&out, "    %6d  %s\n", counts[k], k)
	}
	return out.String()
}

// addElapsed finds the plugin's "rules written" lines in the agent's log, and their elapsed time.
var addElapsed = regexp.MustCompile(`msg="rules written".* elapsed=([0-9.]+[a-zµ]+)`)

// addTimes returns the elapsed time of each ADD that wrote rules for a pod of namespace ns, from
// the plugin's lines in the agent's log.
func addTimes(t testing.TB, log, ns string) []time.Duration {
	t.Helper()
	var out []time.Duration
	for _, l := range strings.Split(log, "\n") {
		if !strings.Contains(l, " namespace="+ns+" ") {
			continue
		}
		if m := addElapsed.FindStringSubmatch(l); m != nil {
			d, err := time.ParseDuration(m[1])
			if err != nil {
				t.Fatalf("elapsed %q in %q: %v", m[1], l, err)
			}
			out = append(out, d)
		}
	}
	return out
}

// agentUsage returns the agent process's peak resident memory (VmHWM) and its CPU seconds (user
// and system) since it started, read from the machine's /proc through its containerd task.
func agentUsage(ctx context.Context, t testing.TB, c *Cluster, ds *corev1.Pod) (rss int64, cpu float64) {
	t.Helper()
	pid := ""
	out, err := c.NodeOf(t, ds).Run(ctx, "ctr", "-n", "k8s.io", "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	id := containerID(t, ds, agentContainer)
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == id {
			pid = f[1]
		}
	}
	status, err := os.ReadFile("/proc/" + pid + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(status), "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			rss = kb << 10
		}
	}
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	// Fields after the command's closing parenthesis; utime and stime are the 14th and 15th of
	// the line, in clock ticks (100 a second on Linux).
	f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+2:]))
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return rss, (utime + stime) / 100
}
