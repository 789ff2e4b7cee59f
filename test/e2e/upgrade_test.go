//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// testRollingUpgrade: the DaemonSet is upgraded from image A to image B (two builds, two tags)
// with the chart's update strategy while a meshed pod is created every second, on each node in
// turn. Every pod created meanwhile starts meshed: its validator exits 0 the first time, possibly
// after the kubelet retried its sandbox (the plugin fails closed while it cannot look the pod
// up), and none runs unmeshed, fails validation or needs the agent to heal it. The counts are
// logged.
func testRollingUpgrade(t *testing.T, c *Cluster) {
	ctx := context.Background()
	old := installDaemonSet(ctx, t, c)
	const ns = "e2e-upgrade"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	create(ctx, t, c.Client, cniWorkload(t, ns, 0, nil)[0])
	_, d := workload(t, "deploy/examples/cni-workload.yaml", ns, 1)
	tmpl := d.Spec.Template

	w := watchPods(ctx, t, c, ns)
	defer w.Stop()
	// Every validator exit and restart the watch sees: a 95 is a pod that started unmeshed.
	var mu sync.Mutex
	exits := map[string]map[int32]bool{}
	restarts := map[string]int32{}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok || ev.Type == watch.Deleted {
				continue
			}
			mu.Lock()
			for _, cs := range p.Status.InitContainerStatuses {
				if cs.Name != "linkerd-network-validator" {
					continue
				}
				restarts[p.Name] = max(restarts[p.Name], cs.RestartCount)
				for _, term := range []*corev1.ContainerStateTerminated{cs.LastTerminationState.Terminated, cs.State.Terminated} {
					if term != nil {
						if exits[p.Name] == nil {
							exits[p.Name] = map[int32]bool{}
						}
						exits[p.Name][term.ExitCode] = true
					}
				}
			}
			mu.Unlock()
		}
	}()

	stop := make(chan struct{})
	var created []string
	creating := make(chan struct{})
	go func() {
		defer close(creating)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(time.Second):
			}
			p := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
			p.Name = fmt.Sprintf("up-%03d", i)
			pin(&p.Spec, c.Nodes[i%len(c.Nodes)])
			if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
				t.Errorf("create pod %s: %v", p.Name, err)
				return
			}
			created = append(created, p.Name)
		}
	}()

	time.Sleep(3 * time.Second)
	ds, err := c.Client.AppsV1().DaemonSets(cniNamespace).Get(ctx, cniDaemonSet, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("DaemonSet update strategy %s, maxUnavailable %v, maxSurge %v; image %s -> %s", ds.Spec.UpdateStrategy.Type,
		ds.Spec.UpdateStrategy.RollingUpdate.MaxUnavailable, ds.Spec.UpdateStrategy.RollingUpdate.MaxSurge,
		ds.Spec.Template.Spec.Containers[0].Image, nextImage)
	for i := range ds.Spec.Template.Spec.Containers {
		ds.Spec.Template.Spec.Containers[i].Image = nextImage
	}
	began := time.Now()
	if _, err := c.Client.AppsV1().DaemonSets(cniNamespace).Update(ctx, ds, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	installed = "upgraded"
	waitFor(ctx, t, 5*time.Minute, "the rollout to image B on every node", func(ctx context.Context) (bool, error) {
		got, err := c.Client.AppsV1().DaemonSets(cniNamespace).Get(ctx, cniDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		s := got.Status
		done := s.ObservedGeneration >= got.Generation && s.UpdatedNumberScheduled == int32(len(c.Nodes)) && s.NumberReady == int32(len(c.Nodes)) && s.NumberUnavailable == 0
		return done, fmt.Errorf("status %+v", s)
	})
	rollout := time.Since(began)
	time.Sleep(5 * time.Second) // pods created just after the rollout count too
	close(stop)
	<-creating

	newPods := daemonSetPods(ctx, t, c)
	for i, p := range newPods {
		if p.UID == old[i].UID || p.Spec.Containers[0].Image != nextImage {
			t.Errorf("node %s: DaemonSet pod %s runs %s, want a new pod on %s", c.Nodes[i].Name, p.Name, p.Spec.Containers[0].Image, nextImage)
		}
	}
	pods := waitPods(ctx, t, c.Client, ns, "app=web", len(created), 4*time.Minute)
	events, err := c.Client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	retried := map[string]int{}
	for _, e := range events.Items {
		if e.Reason == "FailedCreatePodSandBox" {
			retried[e.InvolvedObject.Name] += int(e.Count)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	firstTry, afterRetry := 0, 0
	for _, p := range pods {
		code := exitCode(&p, "linkerd-network-validator")
		if got := exits[p.Name]; code != 0 || len(got) != 1 || !got[0] || restarts[p.Name] != 0 {
			t.Errorf("pod %s on %s: validator exit codes %v, %d restarts (now %d), want one exit 0: it must never run unmeshed", p.Name, p.Spec.NodeName, got, restarts[p.Name], code)
		}
		if rules := ourRules(ctx, t, podNetNS(ctx, t, c, &p, "web")); len(rules) == 0 {
			t.Errorf("pod %s on %s has no rules", p.Name, p.Spec.NodeName)
		}
		if evs := agentEvents(ctx, t, c, ns, p.UID); len(evs) != 0 {
			t.Errorf("pod %s on %s: the agent acted on it: %v; want nothing to heal", p.Name, p.Spec.NodeName, evs)
		}
		if retried[p.Name] > 0 {
			afterRetry++
		} else {
			firstTry++
		}
	}
	t.Logf("rolling upgrade to %s took %v; %d meshed pods created meanwhile, one a second over both nodes: %d meshed at the first sandbox, %d meshed after the kubelet retried their sandbox (%d failed sandbox attempts in all), 0 ran unmeshed",
		nextImage, rollout.Round(time.Second), len(pods), firstTry, afterRetry, sum(retried))
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
