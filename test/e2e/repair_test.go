//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// validatorFailed is the exit code of a validator that found no redirect.
const validatorFailed = 95

// testRepair is scenario 5: a Deployment's pod created before the plugin is in place fails
// validation (exit 95); once the DaemonSet runs with Linkerd's repair controller (the chart
// without the agent, which heals such pods in place instead: AgentHealsInPlace), the controller
// deletes that pod, and the replacement is meshed.
func testRepair(t *testing.T, n *Node) {
	ctx := context.Background()
	removeDaemonSet(ctx, t, n)
	const ns = "e2e-repair"
	t.Cleanup(func() { deleteNamespace(ctx, t, n.Client, ns) })
	create(ctx, t, n.Client, cniWorkload(t, ns, 1)...)
	failed := waitValidatorFailed(ctx, t, n, ns)

	installRendering(ctx, t, n, map[string]any{"agent": map[string]any{"enabled": false}})
	t.Cleanup(func() { removeDaemonSet(ctx, t, n) })
	var pod *corev1.Pod
	waitFor(ctx, t, 3*time.Minute, "a meshed replacement of the failed pod", func(ctx context.Context) (bool, error) {
		l, err := n.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
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
	if rules := ourRules(ctx, t, podNetNS(ctx, t, n, pod, "web")); len(rules) == 0 {
		t.Error("no rules in the replacement pod's network namespace")
	}
	events, err := n.Client.EventsV1().Events(ns).List(ctx, metav1.ListOptions{})
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
