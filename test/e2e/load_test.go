//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// loadPods is how many meshed pods scenario 7 creates at once.
const loadPods = 30

// testLoad is scenario 7: 30 meshed pods created at once all start meshed (each validator exits
// 0). It reports their times from creation to Ready against the same pods on the node without
// the plugin, which must then run without the validator: it would fail by design. Speed is
// reported, not asserted.
func testLoad(t *testing.T, c *Cluster) {
	ctx := context.Background()
	_, d := workload(t, "deploy/examples/cni-workload.yaml", "", 1)
	spec := d.Spec.Template

	installDaemonSet(ctx, t, c)
	meshed := startBatch(ctx, t, c, "e2e-load-meshed", spec, loadPods)
	deleteNamespace(ctx, t, c.Client, "e2e-load-meshed")
	for _, p := range meshed.pods {
		if code := exitCode(p, "linkerd-network-validator"); code != 0 {
			t.Errorf("pod %s: validator exit code %d, want 0", p.Name, code)
		}
	}

	removeDaemonSet(ctx, t, c)
	plain := startBatch(ctx, t, c, "e2e-load-baseline", withoutValidator(spec), loadPods)
	deleteNamespace(ctx, t, c.Client, "e2e-load-baseline")

	t.Logf("%d pods created at once, creation to Ready: with linkerd-cni %s; without (no validator) %s",
		loadPods, meshed.summary(), plain.summary())
}

// withoutValidator is tmpl without the network validator, for pods that run without the plugin,
// where the validator would fail by design.
func withoutValidator(tmpl corev1.PodTemplateSpec) corev1.PodTemplateSpec {
	out := *tmpl.DeepCopy()
	out.Spec.InitContainers = slices.DeleteFunc(out.Spec.InitContainers, func(c corev1.Container) bool {
		return c.Name == "linkerd-network-validator"
	})
	return out
}

type batch struct {
	pods  []*corev1.Pod
	ready []time.Duration
	all   time.Duration // first creation to last Ready
}

func (b batch) summary() string {
	s := slices.Clone(b.ready)
	slices.Sort(s)
	return fmt.Sprintf("median %v, p90 %v, max %v, all %v", s[len(s)/2].Round(10*time.Millisecond),
		s[len(s)*9/10].Round(10*time.Millisecond), s[len(s)-1].Round(10*time.Millisecond), b.all.Round(10*time.Millisecond))
}

// startBatch creates count pods from tmpl in a new namespace, all at once, and times each from
// its creation to Ready. The namespace is deleted at the test's end, or earlier by the caller.
func startBatch(ctx context.Context, t *testing.T, c *Cluster, ns string, tmpl corev1.PodTemplateSpec, count int) batch {
	t.Helper()
	create(ctx, t, c.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}})
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	pods := c.Client.CoreV1().Pods(ns)
	w := watchPods(ctx, t, c, ns)
	defer w.Stop()

	created := make([]time.Time, count)
	var wg sync.WaitGroup
	errs := make(chan error, count)
	for i := range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &corev1.Pod{ObjectMeta: *tmpl.ObjectMeta.DeepCopy(), Spec: *tmpl.Spec.DeepCopy()}
			p.Name, p.Namespace = fmt.Sprintf("load-%03d", i), ns
			created[i] = time.Now()
			if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("create pod: %v", err)
	}
	start := slices.MinFunc(created, func(a, b time.Time) int { return a.Compare(b) })

	b := batch{}
	ready := map[string]*corev1.Pod{}
	timeout := time.After(8 * time.Minute)
	for len(ready) < count {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("pod watch closed with %d of %d pods Ready", len(ready), count)
			}
			p, isPod := ev.Object.(*corev1.Pod)
			if !isPod || ev.Type == watch.Deleted || ready[p.Name] != nil || !podReady(p) {
				continue
			}
			var i int
			fmt.Sscanf(p.Name, "load-%d", &i)
			ready[p.Name] = p
			b.pods = append(b.pods, p)
			b.ready = append(b.ready, time.Since(created[i]))
		case <-timeout:
			t.Fatalf("only %d of %d pods Ready after 8 minutes", len(ready), count)
		}
	}
	b.all = time.Since(start)
	return b
}
