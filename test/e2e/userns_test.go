//go:build e2e

package e2e

import (
	"context"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
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

// ruleBackends returns the backends that hold rules of ours in a network namespace: nftables (the
// native table), iptables-nft, iptables-legacy.
func ruleBackends(ctx context.Context, t testing.TB, netns string) []string {
	t.Helper()
	var have []string
	for _, b := range []struct {
		name, mark string
		cmd        []string
	}{
		{"nftables", "table inet proxy_init", []string{"nft", "list", "tables"}},
		{"iptables-nft", "PROXY_INIT", []string{"iptables-nft-save", "-t", "nat"}},
		{"iptables-legacy", "PROXY_INIT", []string{"iptables-legacy-save"}},
	} {
		out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netns, "--"}, b.cmd...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s in %s: %v: %s", b.cmd[0], netns, err, out)
		}
		if strings.Contains(string(out), b.mark) {
			have = append(have, b.name)
		}
	}
	return have
}

// checkRuleBackend fails unless the pod's rules are in want's backend, and in no other.
func checkRuleBackend(ctx context.Context, t testing.TB, c *Cluster, p *corev1.Pod, want string) {
	t.Helper()
	if have := ruleBackends(ctx, t, podNetNS(ctx, t, c, p, "web")); len(have) != 1 || have[0] != want {
		t.Errorf("pod %s holds rules of ours in %v, want %s alone", p.Name, have, want)
	}
}

// testUserNamespacePod: pods with hostUsers: false, on containerd 2 with runc 1.5. A meshed pod
// starts meshed under the plugin with the chart's default values (iptables-mode nft), its
// validator exits 0 and its traffic passes through the proxy, its rules in the native nftables
// table (the kernel refuses iptables' owner match from outside the pod's user namespace): with
// the agent writing the rules (the default), whose heal after a flush writes the native table
// again, and with the plugin writing them itself (the agent serving no lookups). The same pod
// meshed by proxy-init as an init container, inside the pod's user namespace, does too, in its
// own mode (auto: iptables-nft's rules).
func testUserNamespacePod(t *testing.T, c *Cluster) {
	if !c.Runtime.UserNamespaces {
		t.Skipf("E2E_RUNTIME=%s: containerd 1.6 cannot run pods with hostUsers: false", c.Runtime.Name)
	}
	ctx := context.Background()
	peer := peerPod(ctx, t, c.A())
	// meshedPod starts the example workload in a user namespace on node A and checks it: the
	// init container that set the redirect up (the validator after the plugin, or linkerd-init)
	// exited 0 and the traffic goes through the proxy.
	meshedPod := func(t *testing.T, ns, example, initContainer string) *corev1.Pod {
		t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
		nsObj, d := workload(t, example, ns, 1)
		pin(&d.Spec.Template.Spec, c.A())
		inUserNamespace(&d.Spec.Template.Spec)
		create(ctx, t, c.Client, nsObj, d)
		pod := waitUserNamespacePod(ctx, t, c, ns)
		checkUserNamespace(ctx, t, c, pod, "web")
		if code := exitCode(pod, initContainer); code != 0 {
			t.Errorf("%s exit code %d, want 0 (%s)", initContainer, code, describePod(pod))
		}
		checkMeshedTraffic(ctx, t, c, pod, peer, ipv4)
		checkProxyExempt(ctx, t, c, pod, peer)
		return pod
	}
	const cniWorkload, initWorkload = "deploy/examples/cni-workload.yaml", "deploy/examples/proxy-init-workload.yaml"

	t.Run("Plugin", func(t *testing.T) {
		ds := installDaemonSet(ctx, t, c)
		pod := meshedPod(t, "e2e-userns", cniWorkload, "linkerd-network-validator")
		added := addLine(t, c, pod)
		if !strings.Contains(added, " api_requests=0 ") {
			t.Errorf("the ADD did not take the pod from the agent (it made API requests): %s", added)
		}
		if !strings.Contains(added, " backend=nftables ") {
			t.Errorf("the ADD in iptables-mode nft did not write the native table: %s", added)
		}
		if !strings.Contains(added, " route=agent ") {
			t.Errorf("the ADD was not written by the node agent (route 1), which writes the native table as the plugin does: %s", added)
		}
		checkRuleBackend(ctx, t, c, pod, "nftables")
		// The agent's heal writes the native table too: flush the rules, and change an annotation
		// so that it audits the pod at once rather than within its period.
		netns := podNetNS(ctx, t, c, pod, "web")
		if out, err := exec.CommandContext(ctx, "nsenter", "--net="+netns, "--", "nft", "flush", "ruleset").CombinedOutput(); err != nil {
			t.Fatalf("flush the pod's rules: %v: %s", err, out)
		}
		patch := []byte(`{"metadata":{"annotations":{"e2e.test/poke":"1"}}}`)
		if _, err := c.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFor(ctx, t, time.Minute, "the agent to rewrite the flushed rules", func(ctx context.Context) (bool, error) {
			return len(ourRules(ctx, t, netns)) > 0, nil
		})
		checkRepairedBy(ctx, t, c, pod.Namespace, pod.UID, ds[0], 1, "missing")
		checkRuleBackend(ctx, t, c, pod, "nftables")
		checkMeshedTraffic(ctx, t, c, pod, peer, ipv4)
		checkProxyExempt(ctx, t, c, pod, peer)
	})

	t.Run("PluginWithoutAgentLookups", func(t *testing.T) {
		installDaemonSetWith(ctx, t, c, map[string]any{"agent": map[string]any{"lookups": false}})
		pod := meshedPod(t, "e2e-userns-fallback", cniWorkload, "linkerd-network-validator")
		if added := addLine(t, c, pod); strings.Contains(added, " api_requests=0 ") || !strings.Contains(added, " route=plugin ") {
			t.Errorf("the ADD made no API request (the agent looked the pod up, though lookups are off), or was not the plugin's (route 2): %s", added)
		}
		checkRuleBackend(ctx, t, c, pod, "nftables")
		// The agent's audit reads what the plugin wrote, and finds it right.
		if evs := agentEvents(ctx, t, c, pod.Namespace, pod.UID); len(evs) != 0 {
			t.Errorf("the agent's events on the pod the plugin meshed: %v, want none", evs)
		}
	})

	t.Run("InitContainer", func(t *testing.T) {
		removeDaemonSet(ctx, t, c)
		pod := meshedPod(t, "e2e-userns-init", initWorkload, "linkerd-init")
		checkRuleBackend(ctx, t, c, pod, "iptables-nft")
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

// addLine returns the plugin's "rules written" line of the pod's ADD, from containerd's log on
// the pod's node.
func addLine(t testing.TB, c *Cluster, p *corev1.Pod) string {
	t.Helper()
	re := regexp.MustCompile(`.*msg="rules written" cmd=ADD pod=` + regexp.QuoteMeta(p.Name) + ` namespace=` + regexp.QuoteMeta(p.Namespace) + ` .*`)
	line := re.FindString(c.NodeOf(t, p).ContainerdLog(t))
	if line == "" {
		t.Fatalf("no ADD of the plugin for pod %s/%s in containerd's log", p.Namespace, p.Name)
	}
	t.Logf("ADD: %s", line)
	return line
}
