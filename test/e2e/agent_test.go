//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubemesh/proxy-init/internal/kubetest"
)

// The node agent's scenarios, with the DaemonSet of deploy/linkerd-cni (the agent in repair mode,
// the default), on node A.

const agentContainer = "linkerd-cni-agent"

// waitValidatorFailed waits until the workload's pod in ns has a validator that exited 95, and
// returns the pod's UID.
func waitValidatorFailed(ctx context.Context, t testing.TB, c *Cluster, ns string) types.UID {
	t.Helper()
	var failed types.UID
	waitFor(ctx, t, 3*time.Minute, "the validator to exit 95 without the plugin", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err
		}
		for _, p := range l.Items {
			for _, cs := range p.Status.InitContainerStatuses {
				if cs.Name != "linkerd-network-validator" {
					continue
				}
				for _, term := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
					if term != nil && term.ExitCode == validatorFailed {
						failed = p.UID
						return true, nil
					}
				}
			}
			return false, fmt.Errorf("pod %s: %s", p.Name, describePod(&p))
		}
		return false, fmt.Errorf("%d pods", len(l.Items))
	})
	return failed
}

// agentEvents returns the agent's Events on the pod with uid, as "reason: note".
func agentEvents(ctx context.Context, t testing.TB, c *Cluster, ns string, uid types.UID) []string {
	t.Helper()
	evs, err := c.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.Regarding.UID == uid && e.ReportingController == "linkerd.io/cni-agent" {
			out = append(out, e.Reason+": "+e.Note)
		}
	}
	return out
}

// testAgentHealsInPlace: a meshed pod started while the DaemonSet was absent fails validation;
// once the DaemonSet runs, the agent writes the pod's rules without deleting it, records why, and
// the validator's next run passes.
func testAgentHealsInPlace(t *testing.T, c *Cluster) {
	ctx := context.Background()
	n := c.A()
	removeDaemonSet(ctx, t, c)
	const ns = "e2e-heal"
	t.Cleanup(func() { deleteNamespace(ctx, t, n.Client, ns) })
	create(ctx, t, n.Client, cniWorkload(t, ns, 1, n)...)
	failed := waitValidatorFailed(ctx, t, c, ns)

	installDaemonSet(ctx, t, c)
	// The kubelet reruns the validator after its back-off (at most a few minutes here).
	var pod *corev1.Pod
	waitFor(ctx, t, 6*time.Minute, "the same pod Ready, its validator passing", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err
		}
		for i := range l.Items {
			p := &l.Items[i]
			if p.UID != failed {
				return false, fmt.Errorf("pod %s (%s) replaced the failed one: it was deleted", p.Name, p.UID)
			}
			pod = p
			return podReady(p) && exitCode(p, "linkerd-network-validator") == 0, fmt.Errorf("%s", describePod(p))
		}
		return false, fmt.Errorf("%d pods", len(l.Items))
	})
	if rules := ourRules(ctx, t, podNetNS(ctx, t, c, pod, "web")); len(rules) == 0 {
		t.Error("no rules in the healed pod's network namespace")
	}
	evs := agentEvents(ctx, t, c, ns, failed)
	if len(evs) == 0 || !strings.HasPrefix(evs[0], "RedirectRepaired: ") || !strings.Contains(evs[0], "missing") {
		t.Errorf("the agent's events on the pod: %q, want RedirectRepaired naming the missing rules", evs)
	}
	t.Logf("healed in place: %s", strings.Join(evs, "\n"))
}

// testAgentDrift: rules flushed by hand inside a running meshed pod come back within one audit
// period (the chart's default, one minute), with an Event, and the pod keeps running.
func testAgentDrift(t *testing.T, c *Cluster) {
	ctx := context.Background()
	n := c.A()
	installDaemonSet(ctx, t, c)
	const ns = "e2e-drift"
	t.Cleanup(func() { deleteNamespace(ctx, t, n.Client, ns) })
	create(ctx, t, n.Client, cniWorkload(t, ns, 1, n)...)
	pod := &waitPods(ctx, t, n.Client, ns, "app=web", 1, 3*time.Minute)[0]
	netns := podNetNS(ctx, t, c, pod, "web")
	if out, err := exec.CommandContext(ctx, "nsenter", "--net="+netns, "--", "nft", "flush", "ruleset").CombinedOutput(); err != nil {
		t.Fatalf("flush the pod's rules: %v: %s", err, out)
	}
	if rules := ourRules(ctx, t, netns); len(rules) != 0 {
		t.Fatalf("rules left after the flush: %v", rules)
	}
	flushed := time.Now()
	waitFor(ctx, t, 2*time.Minute, "the rules to come back", func(ctx context.Context) (bool, error) {
		return len(ourRules(ctx, t, netns)) > 0, nil
	})
	took := time.Since(flushed)
	t.Logf("rules back %s after the flush", took.Round(time.Second))
	if took > 75*time.Second {
		t.Errorf("the rules came back after %s, more than one audit period (1m) and an audit", took)
	}
	evs := agentEvents(ctx, t, c, ns, pod.UID)
	if len(evs) != 1 || !strings.HasPrefix(evs[0], "RedirectRepaired: ") {
		t.Errorf("the agent's events on the pod: %q, want one RedirectRepaired", evs)
	}
	now, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod.Name, metav1.GetOptions{})
	if err != nil || now.UID != pod.UID || !podReady(now) {
		t.Errorf("the pod after the repair: %v, %v", now, err)
	}
}

// pluginGETs counts the plugin's GETs of pods and namespaces in ns, in the API server's audit
// log: the linkerd-cni ServiceAccount's requests that are neither list nor watch (the agent's).
func pluginGETs(t testing.TB, c *Cluster, ns string) int {
	t.Helper()
	evs, err := c.Control.AuditEvents(kubetest.ServiceAccountUser(cniNamespace, "linkerd-cni"))
	if err != nil {
		t.Fatal(err)
	}
	count := 0
	for _, e := range evs {
		if e.Verb == "get" && e.ObjectRef != nil && (e.ObjectRef.Namespace == ns || e.ObjectRef.Resource == "namespaces" && e.ObjectRef.Name == ns) {
			count++
		}
	}
	return count
}

// testAgentLookup: with the agent, meshed pods start meshed with no GET from the plugin; with the
// agent stopped (the DaemonSet without it), they still start meshed, through the API.
func testAgentLookup(t *testing.T, c *Cluster) {
	ctx := context.Background()
	n := c.A()
	installDaemonSet(ctx, t, c)
	const ns, nsAPI = "e2e-lookup", "e2e-lookup-api"
	t.Cleanup(func() {
		deleteNamespace(ctx, t, n.Client, ns)
		deleteNamespace(ctx, t, n.Client, nsAPI)
	})
	create(ctx, t, n.Client, cniWorkload(t, ns, 3, n)...)
	for _, p := range waitPods(ctx, t, n.Client, ns, "app=web", 3, 3*time.Minute) {
		if code := exitCode(&p, "linkerd-network-validator"); code != 0 {
			t.Errorf("pod %s: validator exit code %d, want 0", p.Name, code)
		}
	}
	time.Sleep(2 * time.Second) // the audit log is written asynchronously
	if got := pluginGETs(t, c, ns); got != 0 {
		t.Errorf("with the agent, the plugin made %d GETs for 3 meshed pods, want 0", got)
	}

	installDaemonSetWith(ctx, t, c, map[string]any{"agent": map[string]any{"enabled": false}, "repairController": map[string]any{"enabled": false}})
	create(ctx, t, n.Client, cniWorkload(t, nsAPI, 1, n)...)
	pod := &waitPods(ctx, t, n.Client, nsAPI, "app=web", 1, 3*time.Minute)[0]
	if code := exitCode(pod, "linkerd-network-validator"); code != 0 {
		t.Errorf("without the agent: validator exit code %d, want 0", code)
	}
	time.Sleep(2 * time.Second)
	if got := pluginGETs(t, c, nsAPI); got < 1 || got > 2 {
		t.Errorf("without the agent, the plugin made %d GETs for a meshed pod, want 1 or 2", got)
	}
}

// testPluginLogs: a plugin call's lines are in the DaemonSet pod's log (the agent container's),
// with the pod, its namespace and the sandbox's container ID.
func testPluginLogs(t *testing.T, c *Cluster) {
	ctx := context.Background()
	n := c.A()
	ds := installDaemonSet(ctx, t, c)[0]
	const ns = "e2e-logs"
	t.Cleanup(func() { deleteNamespace(ctx, t, n.Client, ns) })
	create(ctx, t, n.Client, cniWorkload(t, ns, 1, n)...)
	pod := &waitPods(ctx, t, n.Client, ns, "app=web", 1, 3*time.Minute)[0]
	m := regexp.MustCompile(`msg="rules written" cmd=ADD pod=` + regexp.QuoteMeta(pod.Name) + ` namespace=` + ns + ` containerID=([0-9a-f]{64})`).
		FindStringSubmatch(n.ContainerdLog(t))
	if m == nil {
		t.Fatalf("no ADD of the plugin for pod %s in containerd's log", pod.Name)
	}
	sandbox := m[1]
	want := regexp.MustCompile(`msg="rules written" cmd=ADD pod=` + regexp.QuoteMeta(pod.Name) + ` namespace=` + ns + ` containerID=` + sandbox + ` .*apiRequests=0`)
	waitFor(ctx, t, 30*time.Second, "the plugin's ADD in the agent's log", func(context.Context) (bool, error) {
		return want.MatchString(podLog(t, c, ds, agentContainer)), fmt.Errorf("no line matching %s", want)
	})
}
