//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// The Chaos scenario's pods: meshed (deploy/examples/cni-workload.yaml) and unmeshed (plainPod),
// spread by the scheduler over both nodes.
const (
	chaosMeshed, chaosPlain = 20, 20
	chaosMeshedNS           = "e2e-chaos"
	chaosPlainNS            = "e2e-chaos-plain"
)

// chaosCounts are the figures the Chaos scenario prints.
type chaosCounts struct {
	created, deleted atomic.Int64
	faults, checked  int
	violations       int
}

// testChaos keeps 40 meshed and unmeshed pods churning on both nodes (a random one deleted
// every second, its Deployment making another) while it SIGKILLs an agent, restarts an
// installer container, restarts a containerd and stops the API server for 30 s. After each
// fault it checks, from the host: the nodes are Ready, no pod is stuck (every pod is Ready once
// the API is back), every meshed pod has exactly the rules of the others and every unmeshed pod
// none. At the end no record, lock, network namespace or temp file is left for a deleted pod.
func testChaos(t *testing.T, c *Cluster) {
	ctx := context.Background()
	installDaemonSet(ctx, t, c)
	before := map[string][]string{}
	for _, n := range c.Nodes {
		before[n.Name] = nodeState(t, n)
	}
	var counts chaosCounts
	t.Cleanup(func() {
		deleteNamespace(ctx, t, c.Client, chaosMeshedNS)
		deleteNamespace(ctx, t, c.Client, chaosPlainNS)
	})
	create(ctx, t, c.Client, cniWorkload(t, chaosMeshedNS, chaosMeshed, nil)...)
	create(ctx, t, c.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: chaosPlainNS}}, plainDeployment(chaosPlainNS, chaosPlain))
	for _, ns := range []string{chaosMeshedNS, chaosPlainNS} {
		w := watchPods(ctx, t, c, ns)
		t.Cleanup(w.Stop)
		go func() {
			for ev := range w.ResultChan() {
				if ev.Type == watch.Added {
					counts.created.Add(1)
				}
			}
		}()
	}
	want := chaosRules(ctx, t, c, &counts, nil)
	t.Logf("chaos: %d meshed pods, each with %d lines of rules, and %d unmeshed pods running", chaosMeshed, len(want), chaosPlain)

	a, b := c.A(), c.B()
	faults := []struct {
		name   string
		inject func() error
	}{
		{"SIGKILL the agent on " + a.Name, func() error { return killDaemonSetContainer(ctx, t, c, a, agentContainer, "SIGKILL") }},
		{"restart the installer container on " + b.Name, func() error { return killDaemonSetContainer(ctx, t, c, b, "install-cni", "SIGTERM") }},
		{"restart containerd on " + a.Name, a.RestartContainerd},
		{"stop the API server for 30 s", func() error {
			if err := c.Control.StopAPIServer(); err != nil {
				return err
			}
			time.Sleep(30 * time.Second)
			return c.Control.StartAPIServer(ctx)
		}},
	}
	for _, f := range faults {
		stop := churn(ctx, c, &counts)
		time.Sleep(8 * time.Second)
		t.Logf("chaos: %s", f.name)
		if err := f.inject(); err != nil {
			stop()
			t.Fatalf("%s: %v", f.name, err)
		}
		counts.faults++
		time.Sleep(8 * time.Second)
		stop()
		t.Run("after "+f.name, func(t *testing.T) { chaosRules(ctx, t, c, &counts, want) })
	}

	deleteNamespace(ctx, t, c.Client, chaosMeshedNS)
	deleteNamespace(ctx, t, c.Client, chaosPlainNS)
	for _, n := range c.Nodes {
		var left []string
		waitFor(ctx, t, 2*time.Minute, "nothing left on "+n.Name+" for the deleted pods", func(context.Context) (bool, error) {
			left = nil
			for _, s := range nodeState(t, n) {
				if !slices.Contains(before[n.Name], s) {
					left = append(left, s)
				}
			}
			return len(left) == 0, fmt.Errorf("left: %v", left)
		})
	}
	t.Logf("chaos: %d pods created, %d deleted by the churn, %d faults injected, %d pods checked, %d violations",
		counts.created.Load(), counts.deleted.Load(), counts.faults, counts.checked, counts.violations)
}

// plainDeployment runs replicas unmeshed pods (plainPod) in ns.
func plainDeployment(ns string, replicas int32) *appsv1.Deployment {
	p := plainPod(ns, "plain")
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: p.Labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: p.ObjectMeta, Spec: p.Spec},
		},
	}
}

// churn deletes a random pod of the Chaos scenario every second, until the returned function is
// called. Errors are ignored: during a fault the API may be gone.
func churn(ctx context.Context, c *Cluster, counts *chaosCounts) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			ns := []string{chaosMeshedNS, chaosPlainNS}[rand.IntN(2)]
			rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
			l, err := c.Client.CoreV1().Pods(ns).List(rctx, metav1.ListOptions{})
			if err == nil && len(l.Items) > 0 {
				p := l.Items[rand.IntN(len(l.Items))]
				if c.Client.CoreV1().Pods(ns).Delete(rctx, p.Name, metav1.DeleteOptions{}) == nil {
					counts.deleted.Add(1)
				}
			}
			rcancel()
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}()
	return func() { cancel(); wg.Wait() }
}

// killDaemonSetContainer sends sig to a container of the DaemonSet's pod on n, through the node's
// containerd; the kubelet restarts the container.
func killDaemonSetContainer(ctx context.Context, t testing.TB, c *Cluster, n *Node, container, sig string) error {
	for i, p := range daemonSetPods(ctx, t, c) {
		if c.Nodes[i] == n {
			_, err := n.Run(ctx, "ctr", "-n", "k8s.io", "tasks", "kill", "-s", sig, containerID(t, p, container))
			return err
		}
	}
	return fmt.Errorf("no DaemonSet pod on %s", n.Name)
}

// chaosRules waits until the nodes, the DaemonSet and every pod of the Chaos scenario are Ready,
// then checks every pod's rules: a meshed pod's must be want (when want is nil, they must be the
// same in every meshed pod, and are returned), an unmeshed pod's none. Each pod that differs is a
// violation.
func chaosRules(ctx context.Context, t *testing.T, c *Cluster, counts *chaosCounts, want []string) []string {
	t.Helper()
	for _, n := range c.Nodes {
		waitFor(ctx, t, 3*time.Minute, "node "+n.Name+" Ready", func(ctx context.Context) (bool, error) {
			ok, why, err := n.Ready(ctx)
			if err == nil && !ok {
				err = fmt.Errorf("%s", why)
			}
			return ok, err
		})
	}
	daemonSetPods(ctx, t, c)
	meshed := waitPods(ctx, t, c.Client, chaosMeshedNS, "app=web", chaosMeshed, 5*time.Minute)
	plain := waitPods(ctx, t, c.Client, chaosPlainNS, "app=plain", chaosPlain, 5*time.Minute)
	violate := func(format string, args ...any) {
		counts.violations++
		t.Errorf(format, args...)
	}
	for i := range meshed {
		p := &meshed[i]
		rules := ourRules(ctx, t, podNetNS(ctx, t, c, p, "web"))
		for i, r := range rules {
			rules[i] = ruleCounters.ReplaceAllString(r, "")
		}
		slices.Sort(rules)
		counts.checked++
		if want == nil {
			if want = rules; len(want) == 0 {
				violate("meshed pod %s on %s has no rules", p.Name, p.Spec.NodeName)
			}
			continue
		}
		if !slices.Equal(rules, want) {
			violate("meshed pod %s on %s: rules differ from the other meshed pods'\n got: %s\nwant: %s",
				p.Name, p.Spec.NodeName, strings.Join(rules, "\n      "), strings.Join(want, "\n      "))
		}
	}
	for i := range plain {
		p := &plain[i]
		counts.checked++
		if rules := ourRules(ctx, t, podNetNS(ctx, t, c, p, "app")); len(rules) > 0 {
			violate("unmeshed pod %s on %s has rules: %v", p.Name, p.Spec.NodeName, rules)
		}
	}
	return want
}

// ruleCounters matches the packet and byte counters in rule listings, which differ from pod to pod.
var ruleCounters = regexp.MustCompile(`packets [0-9]+ bytes [0-9]+|\[[0-9]+:[0-9]+\]`)

// nodeState lists what the plugin and the runtime keep per pod on a node: the plugin's records
// and lock files, the runtime's network namespaces, and the installer's temp files.
func nodeState(t testing.TB, n *Node) []string {
	t.Helper()
	var out []string
	for _, dir := range []string{"/run/linkerd-cni/pods", "/run/linkerd-cni/locks", "/run/netns"} {
		entries, err := os.ReadDir(n.Path(dir))
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		for _, e := range entries {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	for _, dir := range []string{"/etc/cni/net.d", "/opt/cni/bin", "/run/linkerd-cni"} {
		tmp, _ := filepath.Glob(filepath.Join(n.Path(dir), ".linkerd-cni-tmp-*"))
		for _, f := range tmp {
			out = append(out, filepath.Join(dir, filepath.Base(f)))
		}
	}
	return out
}
