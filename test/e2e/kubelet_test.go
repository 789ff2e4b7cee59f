//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// kubeletAnnotations are every annotation the plugin honours, with values the workload's
// validator passes with, so that a pod carrying them needs nothing of its namespace's.
var kubeletAnnotations = map[string]string{
	"config.linkerd.io/skip-outbound-ports": "9999", "config.linkerd.io/skip-inbound-ports": "9998",
	"config.linkerd.io/skip-subnets": "192.0.2.0/24", "config.linkerd.io/skip-inbound-subnets": "198.51.100.0/24",
	"config.linkerd.io/skip-outbound-subnets": "203.0.113.0/24", "config.linkerd.io/proxy-uid": "2102",
	"config.linkerd.io/proxy-gid": "2102", "config.linkerd.io/inbound-port": "4143", "config.linkerd.io/outbound-port": "4140",
	"config.linkerd.io/close-wait-timeout": "3600", "config.linkerd.io/reroute-virtual-interfaces": "tap0",
}

// testKubeletLookup: with the API server out of reach of node A's agent and plugin (the Service
// IP gone, as in APIUnreachable: the kubelets and the control plane still reach it, so a pod can
// still be created and reach the kubelet), node A's agent restarts, so its watches cannot sync;
// a new meshed pod that carries every annotation the plugin reads starts meshed all the same,
// because the agent read it from the kubelet's pods API: the agent says so, the plugin's ADD says
// source=kubelet with no API request, and the API server saw no request for it from linkerd-cni.
// Then, with the API server stopped altogether, a new static pod starts meshed the same way.
func testKubeletLookup(t *testing.T, c *Cluster) {
	ctx := context.Background()
	n := c.A()
	ds := installDaemonSet(ctx, t, c)
	const ns = "e2e-kubelet"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	objs := cniWorkload(t, ns, 1, n)
	create(ctx, t, c.Client, objs[0]) // the namespace, while the agent's watch still runs

	if err := c.SetServiceIP(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.SetServiceIP(true); err != nil {
			t.Error(err)
		}
	})
	// Restart node A's agent: the kubelet restarts the container it sees exit.
	agentPod := ds[0]
	old := containerID(t, agentPod, agentContainer)
	if _, err := n.Run(ctx, "ctr", "-n", "k8s.io", "tasks", "kill", "-s", "SIGTERM", old); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, 2*time.Minute, "node A's agent to run again", func(ctx context.Context) (bool, error) {
		p, err := c.Client.CoreV1().Pods(agentPod.Namespace).Get(ctx, agentPod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, s := range p.Status.ContainerStatuses {
			if s.Name == agentContainer && s.State.Running != nil && strings.TrimPrefix(s.ContainerID, "containerd://") != old {
				agentPod = p
				return true, nil
			}
		}
		return false, fmt.Errorf("agent container not running again: %s", describePod(p))
	})
	// The pod's log holds both containers' lines: the second start is the restarted agent's.
	waitFor(ctx, t, time.Minute, "the restarted agent to serve the plugin", func(context.Context) (bool, error) {
		return strings.Count(podLog(t, c, agentPod, agentContainer), `msg="serving the CNI plugin"`) >= 2, nil
	})

	d := objs[1].(*appsv1.Deployment)
	if d.Spec.Template.Annotations == nil {
		d.Spec.Template.Annotations = map[string]string{}
	}
	maps.Copy(d.Spec.Template.Annotations, kubeletAnnotations)
	create(ctx, t, c.Client, d)
	pod := &waitPods(ctx, t, c.Client, ns, "app=web", 1, 3*time.Minute)[0]
	if code := exitCode(pod, "linkerd-network-validator"); code != 0 || pod.Spec.NodeName != n.Name {
		t.Fatalf("pod %s on %s: validator exit code %d, want 0 on %s", pod.Name, pod.Spec.NodeName, code, n.Name)
	}
	agentLog := podLog(t, c, agentPod, agentContainer)
	if !strings.Contains(agentLog, `msg="pod looked up from the kubelet's pods API"`) || !strings.Contains(agentLog, "pod="+ns+"/"+pod.Name+" uid="+string(pod.UID)+" command=ADD synced=false") {
		t.Errorf("the restarted agent did not read pod %s from the kubelet before its watches synced:\n%s", pod.Name, agentLog)
	}
	wantKubeletADD(t, n, ns, pod.Name)
	time.Sleep(2 * time.Second) // the audit log is written asynchronously
	if got := pluginGETs(t, c, ns); len(got) != 0 {
		t.Errorf("linkerd-cni made GETs for the pod started from the kubelet's answer: %v (by node), want none", got)
	}

	// And with the API server stopped: the one new pod a node starts then is a static pod, which
	// no watch can deliver. The agent restarted above has still not synced.
	startAPIServer := stopAPIServer(ctx, t, c)
	name := startStaticPod(ctx, t, n, ns, d)
	agentLog = podLog(t, c, agentPod, agentContainer)
	if !regexp.MustCompile(`msg="pod looked up from the kubelet's pods API" node=` + n.Name + ` pod=` + ns + `/` + name + ` uid=\S+ command=ADD synced=false`).MatchString(agentLog) {
		t.Errorf("the agent did not read static pod %s from the kubelet:\n%s", name, agentLog)
	}
	wantKubeletADD(t, n, ns, name)
	startAPIServer()
}

// startStaticPod starts the pod of d's template as a static pod on node n, in namespace ns, and
// waits until its app container (web) has started, which it does only once its validator has
// exited 0: the pod is meshed. It returns the pod's name. The manifest is removed at cleanup,
// before a namespace registered earlier goes (the kubelet tears the pod down).
func startStaticPod(ctx context.Context, t *testing.T, n *Node, ns string, d *appsv1.Deployment) string {
	t.Helper()
	static := &corev1.Pod{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "static-web", Namespace: ns, Labels: map[string]string{"app": "static-web"}, Annotations: d.Spec.Template.Annotations},
		Spec:       *d.Spec.Template.Spec.DeepCopy()}
	static.Spec.NodeSelector = nil
	manifest := n.Path(StaticPodDir + "/static-web.json")
	b, err := json.Marshal(static)
	if err != nil {
		t.Fatal(err)
	}
	// Written beside and renamed: the kubelet ignores dot files, and never reads half a file.
	if err := os.WriteFile(n.Path(StaticPodDir+"/.static-web.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(n.Path(StaticPodDir+"/.static-web.json"), manifest); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(manifest) })
	// The kubelet names a static pod after its node.
	name := static.Name + "-" + n.Name
	waitFor(ctx, t, 2*time.Minute, "the static pod's app container to start with the API server stopped", func(context.Context) (bool, error) {
		logs, _ := filepath.Glob(n.Path(fmt.Sprintf("/var/lib/pod-logs/%s_%s_*/web/*.log", ns, name)))
		return len(logs) > 0, fmt.Errorf("no log of container web of %s/%s on %s yet", ns, name, n.Name)
	})
	return name
}

// testPluginKubeletLookup: with no node agent (the chart's agent off), the plugin reads a pod from
// the kubelet's pods API itself. A new meshed pod that carries every annotation it reads starts
// meshed with its ADD saying source=kubelet api_requests=0, and the API server's audit log has no
// GET from linkerd-cni for it (without the kubelet, AgentLookup's pod costs one or two); then,
// with kube-apiserver stopped, a new static pod starts meshed the same way, where before it could
// not have been looked up at all.
func testPluginKubeletLookup(t *testing.T, c *Cluster) {
	ctx := context.Background()
	n := c.A()
	installDaemonSetWith(ctx, t, c, map[string]any{"agent": map[string]any{"enabled": false}, "repairController": map[string]any{"enabled": false}})
	const ns = "e2e-plugin-kubelet"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	objs := cniWorkload(t, ns, 1, n)
	d := objs[1].(*appsv1.Deployment)
	if d.Spec.Template.Annotations == nil {
		d.Spec.Template.Annotations = map[string]string{}
	}
	maps.Copy(d.Spec.Template.Annotations, kubeletAnnotations)
	create(ctx, t, c.Client, objs...)
	pod := &waitPods(ctx, t, c.Client, ns, "app=web", 1, 3*time.Minute)[0]
	if code := exitCode(pod, "linkerd-network-validator"); code != 0 || pod.Spec.NodeName != n.Name {
		t.Fatalf("pod %s on %s: validator exit code %d, want 0 on %s", pod.Name, pod.Spec.NodeName, code, n.Name)
	}
	wantKubeletADD(t, n, ns, pod.Name)
	time.Sleep(2 * time.Second) // the audit log is written asynchronously
	if got := pluginGETs(t, c, ns); len(got) != 0 {
		t.Errorf("without the agent, linkerd-cni made GETs for a pod the kubelet gave: %v (by node), want none", got)
	}

	startAPIServer := stopAPIServer(ctx, t, c)
	name := startStaticPod(ctx, t, n, ns, d)
	wantKubeletADD(t, n, ns, name)
	startAPIServer()
}

// wantKubeletADD fails t unless containerd's log on n has the ADD of pod ns/name set up from the
// kubelet's answer with no API request.
func wantKubeletADD(t *testing.T, n *Node, ns, name string) {
	t.Helper()
	added := regexp.MustCompile(`msg="rules written" cmd=ADD pod=` + regexp.QuoteMeta(name) + ` namespace=` + ns + ` .*source=kubelet api_requests=0`)
	if !added.MatchString(n.ContainerdLog(t)) {
		t.Errorf("no ADD of pod %s with source=kubelet api_requests=0 in containerd's log on %s", name, n.Name)
	}
}

// stopAPIServer stops kube-apiserver until the function it returns starts it again, or the test
// ends.
func stopAPIServer(ctx context.Context, t *testing.T, c *Cluster) (start func()) {
	t.Helper()
	if err := c.Control.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	stopped := true
	restart := func() error {
		stopped = false
		ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		defer cancel()
		return c.Control.StartAPIServer(ctx)
	}
	t.Cleanup(func() {
		if stopped {
			if err := restart(); err != nil {
				t.Error(err)
			}
		}
	})
	return func() {
		t.Helper()
		if err := restart(); err != nil {
			t.Fatal(err)
		}
	}
}
