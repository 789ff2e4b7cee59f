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

// peerNamespace holds the unmeshed pods the scenarios connect from and to, one per node.
const peerNamespace = "e2e-peer"

// peerPod returns the Ready unmeshed peer on node n, creating it the first time.
func peerPod(ctx context.Context, t testing.TB, n *Node) *corev1.Pod {
	t.Helper()
	p := plainPod(peerNamespace, "peer-"+n.Suffix)
	pin(&p.Spec, n)
	create(ctx, t, n.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: peerNamespace}}, p)
	return &waitPods(ctx, t, n.Client, peerNamespace, "app="+p.Name, 1, 2*time.Minute)[0]
}

// exitCode returns how a pod's init container terminated, -1 if it has not.
func exitCode(p *corev1.Pod, container string) int32 {
	for _, cs := range p.Status.InitContainerStatuses {
		if cs.Name == container && cs.State.Terminated != nil {
			return cs.State.Terminated.ExitCode
		}
	}
	return -1
}

// testMeshedPod: deploy/examples' CNI workload starts on node A with the plugin in place; its
// validator exits 0, and real TCP in both directions reaches the fake proxy with the original
// destinations.
func testMeshedPod(t *testing.T, c *Cluster) {
	ctx := context.Background()
	installDaemonSet(ctx, t, c)
	peer := peerPod(ctx, t, c.A())
	const ns = "e2e-meshed"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	create(ctx, t, c.Client, cniWorkload(t, ns, 1, c.A())...)
	pod := &waitPods(ctx, t, c.Client, ns, "app=web", 1, 3*time.Minute)[0]
	if code := exitCode(pod, "linkerd-network-validator"); code != 0 {
		t.Errorf("validator exit code %d, want 0 (%s)", code, describePod(pod))
	}
	if rules := ourRules(ctx, t, podNetNS(ctx, t, c, pod, "web")); len(rules) == 0 {
		t.Error("no proxy-init rules in the meshed pod's network namespace")
	}
	// The chart's agent (audits on, so NET_ADMIN and SYS_ADMIN) writes the ADD: route 1.
	if added := addLine(t, c, pod); !strings.Contains(added, " route=agent ") {
		t.Errorf("the ADD was not written by the node agent (route 1): %s", added)
	}
	checkMeshedTraffic(ctx, t, c, pod, peer, ipv4)
	checkProxyExempt(ctx, t, c, pod, peer)
}

// testInitContainerPod: deploy/examples' proxy-init workload, our image with the chart's command
// line as an init container, writes its rules and the same traffic reaches the fake proxy. The
// plugin is not in place, so the rules can only be proxy-init's.
func testInitContainerPod(t *testing.T, c *Cluster) {
	ctx := context.Background()
	removeDaemonSet(ctx, t, c)
	peer := peerPod(ctx, t, c.A())
	const ns = "e2e-init"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	nsObj, d := workload(t, "deploy/examples/proxy-init-workload.yaml", ns, 1)
	pin(&d.Spec.Template.Spec, c.A())
	create(ctx, t, c.Client, nsObj, d)
	pod := &waitPods(ctx, t, c.Client, ns, "app=web", 1, 3*time.Minute)[0]
	if code := exitCode(pod, "linkerd-init"); code != 0 {
		t.Errorf("linkerd-init exit code %d, want 0 (%s)", code, describePod(pod))
	}
	for _, ctr := range pod.Spec.InitContainers {
		if want := ourImages["ghcr.io/kubemesh/proxy-init"]; ctr.Name == "linkerd-init" && ctr.Image != want {
			t.Errorf("linkerd-init runs %s, want %s", ctr.Image, want)
		}
	}
	if rules := ourRules(ctx, t, podNetNS(ctx, t, c, pod, "web")); len(rules) == 0 {
		t.Error("no proxy-init rules in the pod's network namespace")
	}
	checkMeshedTraffic(ctx, t, c, pod, peer, ipv4)
}

// testUnmeshedPods: with the plugin in place, an unmeshed pod, and a pod with a proxy in a
// namespace the plugin excludes (the DaemonSet's own, which the installer adds to
// kubernetes.exclude-namespaces), get no rules, and traffic to and from them is direct.
func testUnmeshedPods(t *testing.T, c *Cluster) {
	ctx := context.Background()
	installDaemonSet(ctx, t, c)
	peer := peerPod(ctx, t, c.A())
	const ns = "e2e-plain"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	plain := plainPod(ns, "plain")
	pin(&plain.Spec, c.A())
	create(ctx, t, c.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, plain)

	excluded := plainPod(cniNamespace, "excluded")
	pin(&excluded.Spec, c.A())
	excluded.Spec.Containers = append(excluded.Spec.Containers, corev1.Container{
		Name: "linkerd-proxy", Image: AgentImage,
		Command: []string{"/agent", "proxy", "-ports", outboundPort + "," + inboundPort},
	})
	t.Cleanup(func() {
		_ = c.Client.CoreV1().Pods(cniNamespace).Delete(ctx, excluded.Name, metav1.DeleteOptions{})
		waitGone(ctx, t, c.Client, cniNamespace, "app=excluded", 2*time.Minute)
	})
	create(ctx, t, c.Client, excluded)

	for _, p := range []struct{ ns, app string }{{ns, "plain"}, {cniNamespace, "excluded"}} {
		pod := &waitPods(ctx, t, c.Client, p.ns, "app="+p.app, 1, 2*time.Minute)[0]
		if rules := ourRules(ctx, t, podNetNS(ctx, t, c, pod, "app")); len(rules) != 0 {
			t.Errorf("pod %s/%s has rules:\n%s", p.ns, pod.Name, strings.Join(rules, "\n"))
		}
		in, err := execIn(ctx, t, c, peer, "app", "/agent", "dial", pod.Status.PodIP+":"+appPort)
		if err != nil || !strings.Contains(in, p.app+" at "+pod.Status.PodIP+":"+appPort+" answered directly") {
			t.Errorf("inbound to %s/%s: %q, %v; want the app's own direct answer", p.ns, pod.Name, in, err)
		}
		out, err := execIn(ctx, t, c, pod, "app", "/agent", "dial", peer.Status.PodIP+":"+appPort)
		if err != nil || !strings.Contains(out, peer.Name+" at "+peer.Status.PodIP+":"+appPort+" answered directly") {
			t.Errorf("outbound from %s/%s: %q, %v; want the peer's direct answer", p.ns, pod.Name, out, err)
		}
	}
}
