//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
)

// Ports of the fake proxy and the app, as in deploy/examples.
const (
	inboundPort  = "4143"
	outboundPort = "4140"
	appPort      = "8080"
)

// validatorTarget and validatorTarget6 replace the chart's --connect-addr (1.1.1.1:20001) and
// its IPv6 one: the validator never reaches them when the rules work, and without rules its SYN
// must not head for a public address even inside the cluster. No host has them.
const (
	validatorTarget  = "192.0.2.200:20001"
	validatorTarget6 = "[2001:db8::200]:20001"
)

// workload turns one of deploy/examples' workloads into a test workload in namespace ns: our
// agent image as the proxy (a fake one that reports original destinations) and as the app, the
// label the Linkerd injector gives every meshed pod, and replicas.
func workload(t testing.TB, file, ns string, replicas int32) (*corev1.Namespace, *appsv1.Deployment) {
	t.Helper()
	var (
		nsObj  *corev1.Namespace
		deploy *appsv1.Deployment
	)
	for _, obj := range loadObjects(t, file) {
		switch o := obj.(type) {
		case *corev1.Namespace:
			nsObj = o
		case *appsv1.Deployment:
			deploy = o
		}
	}
	if nsObj == nil || deploy == nil {
		t.Fatalf("%s: want a Namespace and a Deployment", file)
	}
	nsObj.Name, deploy.Namespace = ns, ns
	deploy.Spec.Replicas = &replicas
	tmpl := &deploy.Spec.Template
	tmpl.Labels["linkerd.io/control-plane-ns"] = "linkerd"
	adapt := func(c *corev1.Container) {
		useOurImages(c)
		switch c.Name {
		case "linkerd-proxy":
			c.Image, c.Command, c.Args = AgentImage, []string{"/agent", "proxy", "-ports", outboundPort + "," + inboundPort}, nil
		case "linkerd-network-validator":
			for i := 1; i < len(c.Args); i++ {
				switch c.Args[i-1] {
				case "--connect-addr":
					c.Args[i] = validatorTarget
				case "--ipv6-connect-addr":
					c.Args[i] = validatorTarget6
				}
			}
		case "web":
			c.Image, c.Command, c.Args = AgentImage, []string{"/agent", "serve", "-port", appPort, "-name", "web"}, nil
		}
	}
	for i := range tmpl.Spec.InitContainers {
		adapt(&tmpl.Spec.InitContainers[i])
	}
	for i := range tmpl.Spec.Containers {
		adapt(&tmpl.Spec.Containers[i])
	}
	return nsObj, deploy
}

// cniWorkload is deploy/examples/cni-workload.yaml: validator, native sidecar proxy, app; its
// pods on node n, or wherever the scheduler puts them when n is nil.
func cniWorkload(t testing.TB, ns string, replicas int32, n *Node) []runtime.Object {
	nsObj, d := workload(t, "deploy/examples/cni-workload.yaml", ns, replicas)
	if n != nil {
		pin(&d.Spec.Template.Spec, n)
	}
	return []runtime.Object{nsObj, d}
}

// plainPod is an unmeshed pod: the agent serving on appPort, nothing else.
func plainPod(ns, name string) *corev1.Pod {
	no := false
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{"app": name}},
		Spec: corev1.PodSpec{
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{
				Name: "app", Image: AgentImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Command:         []string{"/agent", "serve", "-port", appPort, "-name", name},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: &no},
			}},
		},
	}
}

// deleteNamespace deletes a namespace and waits until it is gone, pods and all.
func deleteNamespace(ctx context.Context, t testing.TB, cs kubernetes.Interface, ns string) {
	t.Helper()
	err := cs.CoreV1().Namespaces().Delete(ctx, ns, metav1.DeleteOptions{})
	if apierrors.IsNotFound(err) {
		return
	}
	if err != nil {
		t.Fatalf("delete namespace %s: %v", ns, err)
	}
	// A namespace of 110 pods on a busy two-core node (make e2e-bench) takes minutes to empty.
	waitFor(ctx, t, 5*time.Minute, "namespace "+ns+" to be deleted", func(ctx context.Context) (bool, error) {
		_, err := cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		return apierrors.IsNotFound(err), err
	})
}

// family is an IP family the traffic checks use.
type family string

const (
	ipv4 family = "IPv4"
	ipv6 family = "IPv6"
)

// outboundTarget is where the checks dial out to, per family: no host has it, and the
// redirect never lets the connection leave the pod.
var outboundTarget = map[family]string{ipv4: "192.0.2.250:80", ipv6: "[2001:db8::250]:80"}

// podIP returns a pod's address of one family.
func podIP(t testing.TB, p *corev1.Pod, f family) string {
	t.Helper()
	for _, ip := range p.Status.PodIPs {
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is4() == (f == ipv4) {
			return ip.IP
		}
	}
	t.Fatalf("pod %s/%s has no %s address (%v)", p.Namespace, p.Name, f, p.Status.PodIPs)
	return ""
}

// checkMeshedTraffic proves the redirect with real TCP, for each family: the app's outbound
// connection lands on the proxy's outbound port with its original destination, and a connection
// from the peer pod lands on the inbound port with the meshed pod's address as its original
// destination.
func checkMeshedTraffic(ctx context.Context, t testing.TB, c *Cluster, meshed, peer *corev1.Pod, families ...family) {
	t.Helper()
	for _, f := range families {
		dst := outboundTarget[f]
		out, err := execIn(ctx, t, c, meshed, "web", "/agent", "dial", dst)
		want := "fake proxy (outbound port " + outboundPort + "): connection from "
		if err != nil || !strings.Contains(out, want) || !strings.Contains(out, "original destination "+dst) {
			t.Errorf("%s outbound from the app of %s: %q, %v; want %q... original destination %s", f, meshed.Name, out, err, want, dst)
		}
		t.Logf("%s outbound from the app of %s: %s", f, meshed.Name, strings.TrimSpace(out))
		target := net.JoinHostPort(podIP(t, meshed, f), appPort)
		out, err = execIn(ctx, t, c, peer, "app", "/agent", "dial", target)
		want = fmt.Sprintf("fake proxy (inbound port %s): connection from %s", inboundPort, net.JoinHostPort(podIP(t, peer, f), ""))
		if err != nil || !strings.Contains(out, want) || !strings.Contains(out, "original destination "+target) {
			t.Errorf("%s inbound from %s (%s) to %s (%s): %q, %v; want %q... original destination %s",
				f, peer.Name, peer.Spec.NodeName, meshed.Name, meshed.Spec.NodeName, out, err, want, target)
		}
		t.Logf("%s inbound from %s (%s) to %s (%s): %s", f, peer.Name, peer.Spec.NodeName, meshed.Name, meshed.Spec.NodeName, strings.TrimSpace(out))
	}
}

// checkProxyExempt proves the proxy's own traffic is exempt: from the pod's linkerd-proxy
// container, running as the proxy's UID, a connection to the peer reaches the peer itself.
func checkProxyExempt(ctx context.Context, t testing.TB, c *Cluster, meshed, peer *corev1.Pod) {
	t.Helper()
	target := net.JoinHostPort(podIP(t, peer, ipv4), appPort)
	out, err := execIn(ctx, t, c, meshed, "linkerd-proxy", "/agent", "dial", target)
	if want := peer.Name + " at " + target + " answered directly"; err != nil || !strings.Contains(out, want) {
		t.Errorf("from the proxy of %s (UID 2102) to %s: %q, %v; want %q: the proxy's own traffic must skip the redirect", meshed.Name, target, out, err, want)
	}
	t.Logf("from the proxy of %s: %s", meshed.Name, strings.TrimSpace(out))
}
