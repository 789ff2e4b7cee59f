//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// inUserNamespace makes a pod's containers run in a user namespace of their own
// (hostUsers: false): root in the pod is an unprivileged user of the node, and the pod's network
// namespace is owned by that user namespace.
func inUserNamespace(spec *corev1.PodSpec) {
	no := false
	spec.HostUsers = &no
}

// checkUserNamespace fails unless the pod's container runs in a user namespace that maps its
// root to another user of the node.
func checkUserNamespace(ctx context.Context, t testing.TB, c *Cluster, p *corev1.Pod, container string) {
	t.Helper()
	ns := podNetNS(ctx, t, c, p, container)
	uidMap := strings.Replace(ns, "/ns/net", "/uid_map", 1)
	out, err := c.NodeOf(t, p).Run(ctx, "cat", uidMap)
	if f := strings.Fields(out); err != nil || len(f) != 3 || f[0] != "0" || f[1] == "0" {
		t.Fatalf("pod %s: %s of container %s is %q (%v); want root mapped to another user of the node", p.Name, uidMap, container, out, err)
	}
	t.Logf("pod %s runs in a user namespace: uid_map %s", p.Name, strings.Join(strings.Fields(out), " "))
}

// testUserNamespacePod: pods with hostUsers: false, on containerd 2 with runc 1.5. A meshed pod
// starts meshed under the plugin with the chart's default values (iptables-mode nft), its
// validator exits 0 and its traffic passes through the proxy; the same pod meshed by proxy-init
// as an init container does too.
func testUserNamespacePod(t *testing.T, c *Cluster) {
	if !c.Runtime.UserNamespaces {
		t.Skipf("E2E_RUNTIME=%s: containerd 1.6 cannot run pods with hostUsers: false", c.Runtime.Name)
	}
	ctx := context.Background()
	peer := peerPod(ctx, t, c.A())

	t.Run("Plugin", func(t *testing.T) {
		installDaemonSet(ctx, t, c)
		const ns = "e2e-userns"
		t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
		nsObj, d := workload(t, "deploy/examples/cni-workload.yaml", ns, 1)
		pin(&d.Spec.Template.Spec, c.A())
		inUserNamespace(&d.Spec.Template.Spec)
		create(ctx, t, c.Client, nsObj, d)
		pod := waitUserNamespacePod(ctx, t, c, ns)
		checkUserNamespace(ctx, t, c, pod, "web")
		if code := exitCode(pod, "linkerd-network-validator"); code != 0 {
			t.Errorf("validator exit code %d, want 0 (%s)", code, describePod(pod))
		}
		checkMeshedTraffic(ctx, t, c, pod, peer, ipv4)
		checkProxyExempt(ctx, t, c, pod, peer)
	})

	t.Run("InitContainer", func(t *testing.T) {
		removeDaemonSet(ctx, t, c)
		const ns = "e2e-userns-init"
		t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
		nsObj, d := workload(t, "deploy/examples/proxy-init-workload.yaml", ns, 1)
		pin(&d.Spec.Template.Spec, c.A())
		inUserNamespace(&d.Spec.Template.Spec)
		create(ctx, t, c.Client, nsObj, d)
		pod := waitUserNamespacePod(ctx, t, c, ns)
		checkUserNamespace(ctx, t, c, pod, "web")
		if code := exitCode(pod, "linkerd-init"); code != 0 {
			t.Errorf("linkerd-init exit code %d, want 0 (%s)", code, describePod(pod))
		}
		checkMeshedTraffic(ctx, t, c, pod, peer, ipv4)
		checkProxyExempt(ctx, t, c, pod, peer)
	})
}

// waitUserNamespacePod waits for the one app=web pod of ns to be Ready; when it does not start,
// the failure names the kubelet's last events about it.
func waitUserNamespacePod(ctx context.Context, t testing.TB, c *Cluster, ns string) *corev1.Pod {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return
		}
		for _, e := range events.Items {
			if e.Type == corev1.EventTypeWarning {
				t.Logf("event %s %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
			}
		}
	})
	return &waitPods(ctx, t, c.Client, ns, "app=web", 1, 2*time.Minute)[0]
}
