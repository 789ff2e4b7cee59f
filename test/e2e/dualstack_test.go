//go:build e2e

package e2e

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// dualStackValues are the linkerd2-cni chart's values for a dual-stack cluster: IPv6 rules too.
var dualStackValues = map[string]any{"disableIPv6": false}

// dualStackWorkload is cniWorkload on node n with the validator checking both families
// (--ipv6, an IPv6 target no host has), and the proxy relaying outbound connections when
// forward is set (it runs as the proxy's UID, whose traffic the rules exempt).
func dualStackWorkload(t testing.TB, ns string, n *Node, forward bool) []runtime.Object {
	t.Helper()
	nsObj, d := workload(t, "deploy/examples/cni-workload.yaml", ns, 1)
	spec := &d.Spec.Template.Spec
	pin(spec, n)
	for i := range spec.InitContainers {
		ctr := &spec.InitContainers[i]
		switch ctr.Name {
		case "linkerd-network-validator":
			ctr.Args = append(ctr.Args, "--ipv6", "--ipv6-connect-addr", validatorTarget6)
		case "linkerd-proxy":
			if forward {
				ctr.Command = append(ctr.Command, "-forward")
			}
		}
	}
	return []runtime.Object{nsObj, d}
}

// testDualStack: with the chart's disableIPv6: false, a meshed pod on node A starts with a
// validator that checks both families, its outbound IPv4 and IPv6 reach the proxy's 4140 with
// their original destinations, and IPv4 and IPv6 from a pod on node B reach its 4143.
func testDualStack(t *testing.T, c *Cluster) {
	ctx := context.Background()
	installDaemonSetWith(ctx, t, c, dualStackValues)
	peer := peerPod(ctx, t, c.B())
	const ns = "e2e-dualstack"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	create(ctx, t, c.Client, dualStackWorkload(t, ns, c.A(), false)...)
	pod := &waitPods(ctx, t, c.Client, ns, "app=web", 1, 3*time.Minute)[0]
	if code := exitCode(pod, "linkerd-network-validator"); code != 0 {
		t.Errorf("validator (IPv4 and IPv6) exit code %d, want 0 (%s)", code, describePod(pod))
	}
	if len(pod.Status.PodIPs) != 2 {
		t.Errorf("pod %s has addresses %v, want one per family", pod.Name, pod.Status.PodIPs)
	}
	checkMeshedTraffic(ctx, t, c, pod, peer, ipv4, ipv6)
}

// testCrossNode: a meshed pod on node A dials a meshed pod on node B, in both families. The
// app's connection lands on A's proxy (outbound, original destination B's pod); A's proxy, as
// the exempt proxy user, relays it to that destination, where B's rules send it to B's proxy
// (inbound, from A's pod, original destination B's pod).
func testCrossNode(t *testing.T, c *Cluster) {
	ctx := context.Background()
	installDaemonSetWith(ctx, t, c, dualStackValues)
	const nsA, nsB = "e2e-cross-a", "e2e-cross-b"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, nsA); deleteNamespace(ctx, t, c.Client, nsB) })
	create(ctx, t, c.Client, dualStackWorkload(t, nsA, c.A(), true)...)
	create(ctx, t, c.Client, dualStackWorkload(t, nsB, c.B(), false)...)
	a := &waitPods(ctx, t, c.Client, nsA, "app=web", 1, 3*time.Minute)[0]
	b := &waitPods(ctx, t, c.Client, nsB, "app=web", 1, 3*time.Minute)[0]
	for _, p := range []*corev1.Pod{a, b} {
		if code := exitCode(p, "linkerd-network-validator"); code != 0 {
			t.Errorf("pod %s on %s: validator exit code %d, want 0", p.Name, p.Spec.NodeName, code)
		}
	}
	for _, f := range []family{ipv4, ipv6} {
		target := net.JoinHostPort(podIP(t, b, f), appPort)
		out, err := execIn(ctx, t, c, a, "web", "/agent", "dial", target)
		t.Logf("%s from %s (%s) to %s (%s): %s", f, a.Name, a.Spec.NodeName, b.Name, b.Spec.NodeName, strings.TrimSpace(out))
		outbound, inbound, _ := strings.Cut(out, "; forwarded: ")
		if err != nil || !strings.Contains(outbound, "fake proxy (outbound port "+outboundPort+")") || !strings.Contains(outbound, "original destination "+target) {
			t.Errorf("%s: node A's side %q, %v; want A's proxy's outbound port with original destination %s", f, outbound, err, target)
		}
		from := net.JoinHostPort(podIP(t, a, f), "")
		if !strings.Contains(inbound, "fake proxy (inbound port "+inboundPort+"): connection from "+from) || !strings.Contains(inbound, "original destination "+target) {
			t.Errorf("%s: node B's side %q; want B's proxy's inbound port, connection from %s..., original destination %s", f, inbound, from, target)
		}
	}
}
