//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// leaveLabel keeps the DaemonSet of testNodeLeavesDaemonSet off a node.
const leaveLabel = "e2e.kubemesh.io/no-linkerd-cni"

// testNodeLeavesDaemonSet: the chart rendered with a required node affinity (nodeAffinity:
// leaveLabel must not exist). Labelling node B is no upgrade: the DaemonSet controller deletes
// B's pod, and its installer, finding that the DaemonSet no longer targets the node, removes its
// entry, the binary and the kubeconfig before the pod's grace period ends. An unmeshed pod
// created on B then starts (with the dead token left in place, its every ADD would fail). Removing
// the label brings an installer back, and a new meshed pod on B is meshed.
func testNodeLeavesDaemonSet(t *testing.T, c *Cluster) {
	ctx := context.Background()
	pods := installDaemonSetWith(ctx, t, c, map[string]any{"nodeAffinity": map[string]any{
		"requiredDuringSchedulingIgnoredDuringExecution": map[string]any{"nodeSelectorTerms": []any{
			map[string]any{"matchExpressions": []any{map[string]any{"key": leaveLabel, "operator": "DoesNotExist"}}}}}}})
	b, old := c.B(), pods[1]
	relabel := func(value *string) {
		t.Helper()
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{leaveLabel: value}}})
		if _, err := c.Client.CoreV1().Nodes().Patch(ctx, b.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatalf("label node %s: %v", b.Name, err)
		}
	}
	t.Cleanup(func() { relabel(nil) })
	yes := "true"
	relabel(&yes)

	// The pod's deletionTimestamp is its deletion plus its grace period: the installer must be
	// done by then.
	var deadline time.Time
	waitFor(ctx, t, time.Minute, "the DaemonSet controller to delete node B's pod", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(cniNamespace).Get(ctx, old.Name, metav1.GetOptions{})
		switch {
		case err == nil && p.DeletionTimestamp != nil:
			deadline = p.DeletionTimestamp.Time
		case apierrors.IsNotFound(err):
			// Gone between two polls (the installer is quick): deleted before now, so its
			// grace period ends before now plus the grace period.
			deadline = time.Now().Add(time.Duration(*old.Spec.TerminationGracePeriodSeconds) * time.Second)
		}
		return !deadline.IsZero(), err
	})
	waitFor(ctx, t, time.Minute, "linkerd-cni gone from node B", func(context.Context) (bool, error) {
		plugins, _ := conflistPlugins(t, b)
		_, binErr := os.Stat(b.Path(pluginPath))
		_, kcErr := os.Stat(b.Path(kubeconfigCNI))
		return strings.Join(plugins, ",") == "bridge,portmap" && os.IsNotExist(binErr) && os.IsNotExist(kcErr),
			fmt.Errorf("plugins %v, binary: %v, kubeconfig: %v", plugins, binErr, kcErr)
	})
	// The API's timestamps have second precision.
	if now := time.Now(); now.After(deadline.Add(time.Second)) {
		t.Errorf("linkerd-cni left node B at %s, after its pod's grace period ended (%s)", now.Format(time.RFC3339), deadline.Format(time.RFC3339))
	}
	if plugins, _ := conflistPlugins(t, c.A()); strings.Join(plugins, ",") != "bridge,portmap,linkerd-cni" {
		t.Errorf("node A, still targeted: plugins %v, want linkerd-cni in place", plugins)
	}

	const ns = "e2e-node-leaves"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	plain := plainPod(ns, "plain")
	pin(&plain.Spec, b)
	create(ctx, t, c.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, plain)
	waitPods(ctx, t, c.Client, ns, "app=plain", 1, 2*time.Minute)

	relabel(nil)
	daemonSetPods(ctx, t, c)
	create(ctx, t, c.Client, cniWorkload(t, ns, 1, b)...)
	pod := &waitPods(ctx, t, c.Client, ns, "app=web", 1, 3*time.Minute)[0]
	if code := exitCode(pod, "linkerd-network-validator"); code != 0 {
		t.Errorf("validator exit code %d, want 0 (%s)", code, describePod(pod))
	}
	if rules := ourRules(ctx, t, podNetNS(ctx, t, c, pod, "web")); len(rules) == 0 {
		t.Error("no proxy-init rules in the meshed pod's network namespace on node B")
	}
}
