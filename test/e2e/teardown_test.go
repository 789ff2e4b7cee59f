//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cniState lists what the CNI chain keeps on the node for running pods: host-local's address
// reservations and libcni's cached results.
func cniState(t testing.TB, n *Node) []string {
	t.Helper()
	var files []string
	for _, dir := range []string{"/var/lib/cni/networks/e2e-bridge", "/var/lib/cni/results"} {
		entries, err := os.ReadDir(n.Path(dir))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() != "lock" && !strings.HasPrefix(e.Name(), "last_reserved_ip") {
				files = append(files, filepath.Join(dir, e.Name()))
			}
		}
	}
	return files
}

// proxiedPod is a pod the plugin counts as meshed (it has a linkerd-proxy container) but with no
// validator, so it starts whether or not the plugin is in place.
func proxiedPod(ns, name string) *corev1.Pod {
	p := plainPod(ns, name)
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{
		Name: "linkerd-proxy", Image: AgentImage,
		Command: []string{"/agent", "proxy", "-ports", outboundPort + "," + inboundPort},
	})
	return p
}

// testTeardown is scenario 6: deleting meshed pods runs containerd's DELs (on stop with the
// netns, on removal without) without an error and leaves nothing of them on the node; deleting
// the DaemonSet makes the installer restore the conflist byte for byte and remove its files, and
// the next pod is not meshed.
func testTeardown(t *testing.T, c *Cluster) {
	ctx := context.Background()
	n := c.A()
	installDaemonSet(ctx, t, c)
	const ns = "e2e-teardown"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	before := cniState(t, n)
	create(ctx, t, c.Client, cniWorkload(t, ns, 2, n)...)
	pods := waitPods(ctx, t, c.Client, ns, "app=web", 2, 3*time.Minute)
	running := cniState(t, n)
	// The plugin's standard error lands in containerd's log; its ADD names the sandbox.
	var sandboxes []string
	for _, p := range pods {
		m := regexp.MustCompile(`msg="rules written" cmd=ADD pod=` + regexp.QuoteMeta(p.Name) + ` namespace=` + ns + ` container_id=([0-9a-f]+)`).
			FindStringSubmatch(n.ContainerdLog(t))
		if m == nil {
			t.Fatalf("no ADD of the plugin for pod %s in containerd's log", p.Name)
		}
		sandboxes = append(sandboxes, m[1])
	}

	// The kubelet stops a deleted pod's sandbox at once (DEL with the netns and the cached
	// result) and removes it at its next garbage collection, within a minute (DEL again).
	deleteNamespace(ctx, t, c.Client, ns)
	waitFor(ctx, t, 3*time.Minute, "the kubelet to remove the sandboxes", func(context.Context) (bool, error) {
		log := n.ContainerdLog(t)
		for _, id := range sandboxes {
			if !strings.Contains(log, `RemovePodSandbox \"`+id+`\" returns successfully`) {
				return false, fmt.Errorf("sandbox %s not removed", id)
			}
		}
		return true, nil
	})
	log := n.ContainerdLog(t)
	for _, id := range sandboxes {
		if got := strings.Count(log, `TearDown network for sandbox \"`+id+`\" successfully`); got < 2 {
			t.Errorf("sandbox %s: the CNI chain's DEL succeeded %d times, want at least 2 (stop and removal)", id, got)
		}
		for _, line := range strings.Split(log, "\n") {
			if strings.Contains(line, id) && (strings.Contains(line, "failed to destroy network") ||
				strings.Contains(line, "cmd=DEL") && !strings.Contains(line, "level=DEBUG")) {
				t.Errorf("sandbox %s: teardown logged a problem: %s", id, line)
			}
		}
	}
	if after := cniState(t, n); !slices.Equal(after, before) {
		t.Errorf("CNI state on the node after deleting the pods:\n%s\nwant as before them:\n%s\n(with them: %s)",
			strings.Join(after, "\n"), strings.Join(before, "\n"), strings.Join(running, "\n"))
	}
	for _, p := range pods {
		if _, err := os.Stat(n.Path("/var/lib/cni/networks/e2e-bridge/" + p.Status.PodIP)); !os.IsNotExist(err) {
			t.Errorf("address %s of deleted pod %s still reserved (%v)", p.Status.PodIP, p.Name, err)
		}
	}

	removeDaemonSet(ctx, t, c)
	if got, err := os.ReadFile(n.Path(conflistPath)); err != nil || string(got) != bridgeConflist(c.Runtime.CNIVersion, n.nodeSpec) {
		t.Errorf("conflist after the installer's SIGTERM (%v):\n%s\nwant the original, byte for byte:\n%s", err, got, bridgeConflist(c.Runtime.CNIVersion, n.nodeSpec))
	}
	for _, f := range []string{pluginPath, kubeconfigCNI} {
		if _, err := os.Stat(n.Path(f)); !os.IsNotExist(err) {
			t.Errorf("%s still on the node after the DaemonSet is gone (%v)", f, err)
		}
	}

	const after = "e2e-after"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, after) })
	create(ctx, t, c.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: after}}, proxiedPod(after, "next"))
	next := &waitPods(ctx, t, c.Client, after, "app=next", 1, 2*time.Minute)[0]
	if rules := ourRules(ctx, t, podNetNS(ctx, t, c, next, "app")); len(rules) != 0 {
		t.Errorf("a pod created after the DaemonSet's removal has rules:\n%s", strings.Join(rules, "\n"))
	}
}
