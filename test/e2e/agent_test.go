//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubemesh/proxy-init/test/kubetest"
)

// The node agent's scenarios, with the DaemonSet of deploy/linkerd-cni (the agent in repair mode,
// the default) on both nodes. Each puts a pod on every node and checks that the node's own agent,
// and never the other's, acted on it.

const agentContainer = "linkerd-cni-agent"

// waitValidatorFailed waits until the workload's pod in ns has a validator that exited 95, and
// returns the pod's UID.
func waitValidatorFailed(ctx context.Context, t testing.TB, c *Cluster, ns string) types.UID {
	t.Helper()
	var failed types.UID
	waitFor(ctx, t, 3*time.Minute, "the validator in "+ns+" to exit 95 without the plugin", func(ctx context.Context) (bool, error) {
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

// agentEvent is one Event of the agent on a pod.
type agentEvent struct {
	Reason, Note string
	// Instance is the DaemonSet pod that reported it.
	Instance string
}

func (e agentEvent) String() string { return e.Reason + " (by " + e.Instance + "): " + e.Note }

// agentEvents returns the agent's Events on the pod with uid.
func agentEvents(ctx context.Context, t testing.TB, c *Cluster, ns string, uid types.UID) []agentEvent {
	t.Helper()
	evs, err := c.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []agentEvent
	for _, e := range evs.Items {
		if e.Regarding.UID == uid && e.ReportingController == "linkerd.io/cni-agent" {
			out = append(out, agentEvent{e.Reason, e.Note, e.ReportingInstance})
		}
	}
	return out
}

// checkRepairedBy fails unless the agent's Events on the pod with uid are n RedirectRepaired
// Events (naming want) and nothing else, all reported by the DaemonSet pod ds.
func checkRepairedBy(ctx context.Context, t testing.TB, c *Cluster, ns string, uid types.UID, ds *corev1.Pod, n int, want string) {
	t.Helper()
	evs := agentEvents(ctx, t, c, ns, uid)
	ok := len(evs) == n
	for _, e := range evs {
		ok = ok && e.Reason == "RedirectRepaired" && strings.Contains(e.Note, want) && e.Instance == ds.Name
	}
	if !ok {
		t.Errorf("the agent's events on the pod in %s: %v; want %d RedirectRepaired naming %q, all by %s, the DaemonSet pod of the pod's node %s",
			ns, evs, n, want, ds.Name, ds.Spec.NodeName)
	}
	for _, e := range evs {
		t.Logf("%s: %s", ns, e)
	}
}

// nodeNamespace is the namespace a scenario's pods on node n live in: prefix-<a|b>.
func nodeNamespace(prefix string, n *Node) string { return prefix + "-" + n.Suffix }

// testAgentHealsInPlace: on each node, a meshed pod started while the DaemonSet was absent fails
// validation; once the DaemonSet runs, the agent of that node writes the pod's rules through the
// runtime's CRI without deleting it, records why, and the validator's next run passes.
func testAgentHealsInPlace(t *testing.T, c *Cluster) {
	ctx := context.Background()
	removeDaemonSet(ctx, t, c)
	failed := make([]types.UID, len(c.Nodes))
	for _, n := range c.Nodes {
		ns := nodeNamespace("e2e-heal", n)
		t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
		create(ctx, t, c.Client, cniWorkload(t, ns, 1, n)...)
	}
	for i, n := range c.Nodes {
		failed[i] = waitValidatorFailed(ctx, t, c, nodeNamespace("e2e-heal", n))
	}

	ds := installDaemonSet(ctx, t, c)
	for i, n := range c.Nodes {
		ns := nodeNamespace("e2e-heal", n)
		// The kubelet reruns the validator after its back-off (at most a few minutes here).
		var pod *corev1.Pod
		waitFor(ctx, t, 6*time.Minute, "the same pod on "+n.Name+" Ready, its validator passing", func(ctx context.Context) (bool, error) {
			l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
			if err != nil {
				return false, err
			}
			for j := range l.Items {
				if p := &l.Items[j]; p.UID != failed[i] {
					return false, fmt.Errorf("pod %s (%s) replaced the failed one: it was deleted", p.Name, p.UID)
				}
			}
			if len(l.Items) != 1 {
				return false, fmt.Errorf("%d pods", len(l.Items))
			}
			pod = &l.Items[0]
			return podReady(pod) && exitCode(pod, "linkerd-network-validator") == 0, fmt.Errorf("%s", describePod(pod))
		})
		if rules := ourRules(ctx, t, podNetNS(ctx, t, c, pod, "web")); len(rules) == 0 {
			t.Errorf("no rules in the healed pod's network namespace on %s", n.Name)
		}
		checkRepairedBy(ctx, t, c, ns, failed[i], ds[i], 1, "missing")
	}
}

// testAgentDrift: rules flushed by hand inside a running meshed pod on each node come back within
// one audit period (the chart's default, one minute), with one Event from that node's agent, and
// the pods keep running.
func testAgentDrift(t *testing.T, c *Cluster) {
	ctx := context.Background()
	ds := installDaemonSet(ctx, t, c)
	for _, n := range c.Nodes {
		ns := nodeNamespace("e2e-drift", n)
		t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
		create(ctx, t, c.Client, cniWorkload(t, ns, 1, n)...)
	}
	pods := make([]*corev1.Pod, len(c.Nodes))
	netns := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		pods[i] = &waitPods(ctx, t, c.Client, nodeNamespace("e2e-drift", n), "app=web", 1, 3*time.Minute)[0]
		netns[i] = podNetNS(ctx, t, c, pods[i], "web")
	}
	flushed := time.Now()
	for i, n := range c.Nodes {
		if out, err := exec.CommandContext(ctx, "nsenter", "--net="+netns[i], "--", "nft", "flush", "ruleset").CombinedOutput(); err != nil {
			t.Fatalf("flush the rules of the pod on %s: %v: %s", n.Name, err, out)
		}
		if rules := ourRules(ctx, t, netns[i]); len(rules) != 0 {
			t.Fatalf("rules left after the flush on %s: %v", n.Name, rules)
		}
	}
	for i, n := range c.Nodes {
		waitFor(ctx, t, 2*time.Minute, "the rules of the pod on "+n.Name+" to come back", func(ctx context.Context) (bool, error) {
			return len(ourRules(ctx, t, netns[i])) > 0, nil
		})
		took := time.Since(flushed)
		t.Logf("%s: rules back within %s of the flush", n.Name, took.Round(time.Second))
		if took > 75*time.Second {
			t.Errorf("%s: the rules came back after %s, more than one audit period (1m) and an audit", n.Name, took)
		}
	}
	for i, n := range c.Nodes {
		checkRepairedBy(ctx, t, c, pods[i].Namespace, pods[i].UID, ds[i], 1, "missing")
		now, err := c.Client.CoreV1().Pods(pods[i].Namespace).Get(ctx, pods[i].Name, metav1.GetOptions{})
		if err != nil || now.UID != pods[i].UID || !podReady(now) {
			t.Errorf("the pod on %s after the repair: %v, %v", n.Name, now, err)
		}
	}
}

// nodeSources maps each node to the addresses its requests reach the API server from: node A's
// through the Service IP on its own lo (or its address), node B's from its address.
func nodeSources(c *Cluster) map[string][]string {
	return map[string][]string{c.A().Name: {serviceIP, c.A().IPv4}, c.B().Name: {c.B().IPv4}}
}

// pluginGETs counts the GETs of pods in ns and of namespace ns, in the API server's audit log, by
// the linkerd-cni ServiceAccount (the agent only lists and watches), per node the requests came
// from ("?" for an address of neither).
func pluginGETs(t testing.TB, c *Cluster, ns string) map[string]int {
	t.Helper()
	evs, err := c.Control.AuditEvents(kubetest.ServiceAccountUser(cniNamespace, "linkerd-cni"))
	if err != nil {
		t.Fatal(err)
	}
	count := map[string]int{}
	for _, e := range evs {
		if e.Verb != "get" || e.ObjectRef == nil || (e.ObjectRef.Namespace != ns && (e.ObjectRef.Resource != "namespaces" || e.ObjectRef.Name != ns)) {
			continue
		}
		from := "?"
		for node, addrs := range nodeSources(c) {
			if len(e.SourceIPs) > 0 && slices.Contains(addrs, e.SourceIPs[0]) {
				from = node
			}
		}
		count[from]++
	}
	return count
}

// testAgentLookup: with the agent, meshed pods on both nodes start meshed with no GET from the
// plugin on either node; with the agent stopped (the DaemonSet without it), a pod on each node
// still starts meshed, its plugin reading the pod from the kubelet and its namespace through the
// API, from its own node.
func testAgentLookup(t *testing.T, c *Cluster) {
	ctx := context.Background()
	installDaemonSet(ctx, t, c)
	for _, n := range c.Nodes {
		for _, prefix := range []string{"e2e-lookup", "e2e-lookup-api"} {
			ns := nodeNamespace(prefix, n)
			t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
		}
		create(ctx, t, c.Client, cniWorkload(t, nodeNamespace("e2e-lookup", n), 2, n)...)
	}
	for _, n := range c.Nodes {
		for _, p := range waitPods(ctx, t, c.Client, nodeNamespace("e2e-lookup", n), "app=web", 2, 3*time.Minute) {
			if code := exitCode(&p, "linkerd-network-validator"); code != 0 || p.Spec.NodeName != n.Name {
				t.Errorf("pod %s on %s: validator exit code %d, want 0 on %s", p.Name, p.Spec.NodeName, code, n.Name)
			}
			if added := addLine(t, c, &p); !strings.Contains(added, " route=agent ") {
				t.Errorf("pod %s on %s: the ADD was not written by the node agent (route 1): %s", p.Name, n.Name, added)
			}
		}
	}
	time.Sleep(2 * time.Second) // the audit log is written asynchronously
	for _, n := range c.Nodes {
		got := pluginGETs(t, c, nodeNamespace("e2e-lookup", n))
		if len(got) != 0 {
			t.Errorf("with the agent, the plugin made GETs for 2 meshed pods on %s: %v (by node), want none", n.Name, got)
		}
	}

	installDaemonSetWith(ctx, t, c, map[string]any{"agent": map[string]any{"enabled": false}, "repairController": map[string]any{"enabled": false}})
	for _, n := range c.Nodes {
		create(ctx, t, c.Client, cniWorkload(t, nodeNamespace("e2e-lookup-api", n), 1, n)...)
	}
	for _, n := range c.Nodes {
		ns := nodeNamespace("e2e-lookup-api", n)
		pod := &waitPods(ctx, t, c.Client, ns, "app=web", 1, 3*time.Minute)[0]
		if code := exitCode(pod, "linkerd-network-validator"); code != 0 {
			t.Errorf("without the agent, on %s: validator exit code %d, want 0", n.Name, code)
		}
		if added := addLine(t, c, pod); !strings.Contains(added, " route=plugin ") {
			t.Errorf("without the agent, on %s: the ADD was not written by the plugin (route 2): %s", n.Name, added)
		}
	}
	time.Sleep(2 * time.Second)
	for _, n := range c.Nodes {
		// The plugin reads the pod from the kubelet, and its namespace (the pod carries no
		// annotation) from the API.
		got := pluginGETs(t, c, nodeNamespace("e2e-lookup-api", n))
		if len(got) != 1 || got[n.Name] != 1 {
			t.Errorf("without the agent, the plugin's GETs for a meshed pod on %s, by node: %v; want 1 (its namespace), from %s", n.Name, got, n.Name)
		}
	}
}

// testPluginLogs: a plugin call's lines are in the log of its node's DaemonSet pod (the agent
// container's), with the pod, its namespace and the sandbox's container ID, and not in the other
// node's.
func testPluginLogs(t *testing.T, c *Cluster) {
	ctx := context.Background()
	ds := installDaemonSet(ctx, t, c)
	for _, n := range c.Nodes {
		ns := nodeNamespace("e2e-logs", n)
		t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
		create(ctx, t, c.Client, cniWorkload(t, ns, 1, n)...)
	}
	for i, n := range c.Nodes {
		ns := nodeNamespace("e2e-logs", n)
		pod := &waitPods(ctx, t, c.Client, ns, "app=web", 1, 3*time.Minute)[0]
		added := `msg="rules written" cmd=ADD pod=` + regexp.QuoteMeta(pod.Name) + ` namespace=` + ns + ` container_id=`
		m := regexp.MustCompile(added + `([0-9a-f]{64})`).FindStringSubmatch(n.ContainerdLog(t))
		if m == nil {
			t.Fatalf("no ADD of the plugin for pod %s in containerd's log on %s", pod.Name, n.Name)
		}
		want := regexp.MustCompile(added + m[1] + ` .*api_requests=0`)
		waitFor(ctx, t, 30*time.Second, "the plugin's ADD in the agent's log on "+n.Name, func(context.Context) (bool, error) {
			return want.MatchString(podLog(t, c, ds[i], agentContainer)), fmt.Errorf("no line matching %s", want)
		})
		other := ds[(i+1)%len(ds)]
		if strings.Contains(podLog(t, c, other, agentContainer), m[1]) {
			t.Errorf("the agent of %s logged the sandbox %s of node %s", other.Spec.NodeName, m[1], n.Name)
		}
	}
}
