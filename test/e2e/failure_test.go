//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// testAPIUnreachable is scenario 8: while the plugin cannot reach the API server, a meshed pod's
// sandbox is not created, and the kubelet's events carry the plugin's message; once the API is
// back, the kubelet's retry creates the sandbox and the pod is meshed.
func testAPIUnreachable(t *testing.T, c *Cluster) {
	ctx := context.Background()
	n := c.A()
	installDaemonSet(ctx, t, c)
	const ns = "e2e-failure"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })

	// The plugin's kubeconfig names the kubernetes Service's IP; the kubelet and the control
	// plane use 127.0.0.1, so only pods and the plugin lose the API.
	if err := c.SetServiceIP(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.SetServiceIP(true); err != nil {
			t.Error(err)
		}
	})
	create(ctx, t, c.Client, cniWorkload(t, ns, 1, n)...)
	var msg string
	waitFor(ctx, t, 3*time.Minute, "a FailedCreatePodSandBox event from the plugin", func(ctx context.Context) (bool, error) {
		events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		for _, e := range events.Items {
			if e.Reason == "FailedCreatePodSandBox" && e.Source.Component == "kubelet" &&
				strings.Contains(e.Message, `plugin type="linkerd-cni"`) && strings.Contains(e.Message, "failed (add)") {
				msg = e.Message
				return true, nil
			}
		}
		return false, fmt.Errorf("%d events, none from the plugin", len(events.Items))
	})
	t.Logf("kubelet event while the API is unreachable: %s", msg)
	for _, want := range []string{ns + "/", serviceIP} {
		if !strings.Contains(msg, want) {
			t.Errorf("the event does not name %q: %s", want, msg)
		}
	}
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range l.Items {
		if p.Status.PodIP != "" {
			t.Errorf("pod %s has address %s while the plugin cannot reach the API: its sandbox must not exist", p.Name, p.Status.PodIP)
		}
	}

	if err := c.SetServiceIP(true); err != nil {
		t.Fatal(err)
	}
	pod := &waitPods(ctx, t, c.Client, ns, "app=web", 1, 3*time.Minute)[0]
	if code := exitCode(pod, "linkerd-network-validator"); code != 0 {
		t.Errorf("validator exit code %d once the API is back, want 0", code)
	}
}
