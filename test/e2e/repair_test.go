//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubemesh/proxy-init/test/kubetest"
)

// validatorFailed is the exit code of a validator that found no redirect.
const validatorFailed = 95

// testRepair is scenario 5: a Deployment's pod created before the plugin is in place fails
// validation (exit 95); once the DaemonSet runs with Linkerd's repair controller (the chart
// without the agent, which heals such pods in place instead: AgentHealsInPlace), the controller
// deletes that pod, and the replacement is meshed.
func testRepair(t *testing.T, c *Cluster) {
	ctx := context.Background()
	n := c.A()
	removeDaemonSet(ctx, t, c)
	const ns = "e2e-repair"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	create(ctx, t, c.Client, cniWorkload(t, ns, 1, n)...)
	failed := waitValidatorFailed(ctx, t, c, ns)

	installDaemonSetWith(ctx, t, c, map[string]any{"agent": map[string]any{"enabled": false}})
	var pod *corev1.Pod
	waitFor(ctx, t, 3*time.Minute, "a meshed replacement of the failed pod", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
		if err != nil {
			return false, err
		}
		for i := range l.Items {
			p := &l.Items[i]
			if p.UID != failed && podReady(p) && p.DeletionTimestamp == nil {
				pod = p
				return true, nil
			}
		}
		return false, fmt.Errorf("%d pods, none a Ready replacement", len(l.Items))
	})
	if code := exitCode(pod, "linkerd-network-validator"); code != 0 {
		t.Errorf("replacement's validator exit code %d, want 0", code)
	}
	if rules := ourRules(ctx, t, podNetNS(ctx, t, c, pod, "web")); len(rules) == 0 {
		t.Error("no rules in the replacement pod's network namespace")
	}
	events, err := c.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var reasons []string
	for _, e := range events.Items {
		if e.Regarding.UID == failed {
			reasons = append(reasons, e.Reason+": "+e.Note)
			if e.Reason == "NetworkValidatorFailed" && e.ReportingController == "linkerd.io/cni-repair-controller" {
				return
			}
		}
	}
	t.Errorf("no NetworkValidatorFailed event from the repair controller on the failed pod; its events:\n%s", strings.Join(reasons, "\n"))
}

// brokenPod is a bare meshed pod on node n whose validator always fails (exit 95): an annotation
// makes the plugin skip the validator's target port, so its connection is not redirected (and
// heads for an address no host has).
func brokenPod(t testing.TB, ns, name string, n *Node) *corev1.Pod {
	t.Helper()
	_, d := workload(t, "deploy/examples/cni-workload.yaml", ns, 1)
	p := &corev1.Pod{ObjectMeta: *d.Spec.Template.ObjectMeta.DeepCopy(), Spec: *d.Spec.Template.Spec.DeepCopy()}
	p.Name, p.Namespace = name, ns
	p.Labels["app"] = name // the injector's linkerd.io/control-plane-ns stays: the repair controller selects on it
	if p.Annotations == nil {
		p.Annotations = map[string]string{}
	}
	p.Annotations["config.linkerd.io/skip-outbound-ports"] = validatorTarget[strings.LastIndex(validatorTarget, ":")+1:]
	pin(&p.Spec, n)
	return p
}

// testRepairScope: each node's DaemonSet acts on the pods of its own node only, and in the
// chart's default mode deletes none. A pod whose validator always fails (brokenPod) runs on each
// node. With the chart's defaults (the agent in repair mode) its rules are the ones its
// annotations ask for, so the agents leave it as it is (no rewrite, no Event, not deleted) while
// its validator keeps failing. With agent.mode delete (what Linkerd's repair controller does) each
// is deleted once, with an Event reported by the DaemonSet pod of its own node, and the API
// server's audit log shows every request of the DaemonSet's service account about it coming from
// that node (the nodes reach the API from different addresses).
func testRepairScope(t *testing.T, c *Cluster) {
	ctx := context.Background()
	installDaemonSet(ctx, t, c)
	const ns = "e2e-scope"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	create(ctx, t, c.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	var ds []*corev1.Pod
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, p := range ds {
			t.Logf("agent on %s:\n%s", p.Spec.NodeName, podLog(t, c, p, agentContainer))
		}
		l, _ := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		for i := range l.Items {
			t.Logf("validator of %s:\n%s", l.Items[i].Name, podLog(t, c, &l.Items[i], "linkerd-network-validator"))
		}
	})
	began := time.Now()
	uids := map[string]types.UID{}
	for _, n := range c.Nodes {
		p := brokenPod(t, ns, "broken-"+n.Suffix, n)
		got, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[p.Name] = got.UID
	}

	// The agent audits a pod at once when its validator fails: once the kubelet has restarted a
	// failed validator (after a 10 s back-off), both agents have looked at their pod.
	waitFor(ctx, t, 3*time.Minute, "both broken pods' validators to fail and be restarted", func(ctx context.Context) (bool, error) {
		for name := range uids {
			p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			restarted := false
			for _, cs := range p.Status.InitContainerStatuses {
				if last := cs.LastTerminationState.Terminated; cs.Name == "linkerd-network-validator" {
					restarted = cs.RestartCount >= 1 && last != nil && last.ExitCode == validatorFailed
				}
			}
			if p.UID != uids[name] || !restarted {
				return false, fmt.Errorf("pod %s (%s): %s", name, p.UID, describePod(p))
			}
		}
		return true, nil
	})
	t.Logf("both validators failed and were restarted %s after the pods' creation, the agents in repair mode", time.Since(began).Round(time.Second))
	for name, uid := range uids {
		if evs := agentEvents(ctx, t, c, ns, uid); len(evs) != 0 {
			t.Errorf("pod %s, rules as annotated: the agents' events %v, want none (repair mode leaves such a pod)", name, evs)
		}
	}

	ds = installDaemonSetWith(ctx, t, c, map[string]any{"agent": map[string]any{"mode": "delete"}})
	waitFor(ctx, t, 3*time.Minute, "both nodes' agents in delete mode to delete their broken pod", func(ctx context.Context) (bool, error) {
		l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		var left []string
		for _, p := range l.Items {
			left = append(left, p.Name+" on "+p.Spec.NodeName+": "+describePod(&p))
		}
		return len(left) == 0, fmt.Errorf("left: %s", strings.Join(left, "; "))
	})

	events, err := c.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	from := nodeSources(c)
	sa := kubetest.ServiceAccountUser(cniNamespace, "linkerd-cni")
	audit, err := c.Control.AuditEvents(sa)
	if err != nil {
		t.Fatal(err)
	}
	for i, n := range c.Nodes {
		name := "broken-" + n.Suffix
		var reporters []string
		for _, e := range events.Items {
			if e.Regarding.UID == uids[name] && e.Reason == "NetworkValidatorFailed" {
				reporters = append(reporters, e.ReportingInstance)
			}
		}
		if len(reporters) != 1 || reporters[0] != ds[i].Name {
			t.Errorf("pod %s on %s: NetworkValidatorFailed reported by %v, want once by that node's DaemonSet pod %s", name, n.Name, reporters, ds[i].Name)
		}
		deletes := 0
		for _, e := range audit {
			if e.ObjectRef == nil || e.ObjectRef.Resource != "pods" || e.ObjectRef.Namespace != ns || e.ObjectRef.Name != name || e.RequestReceivedTimestamp.Before(began.Add(-time.Second)) {
				continue
			}
			if e.Verb == "delete" {
				deletes++
				t.Logf("pod %s on %s: deleted by the DaemonSet's service account from %v, event reported by %v", name, n.Name, e.SourceIPs, reporters)
			}
			if len(e.SourceIPs) == 0 || !slices.Contains(from[n.Name], e.SourceIPs[0]) {
				t.Errorf("pod %s on %s: %s %s by the DaemonSet's service account from %v, not from node %s (%v)", name, n.Name, e.Verb, e.RequestURI, e.SourceIPs, n.Name, from[n.Name])
			}
		}
		if deletes != 1 {
			t.Errorf("pod %s on %s: deleted %d times by the DaemonSet's service account, want once", name, n.Name, deletes)
		}
	}
}
