package repair_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/cniplugin/repair"
	"github.com/kubemesh/proxy-init/test/helmchart"
	"github.com/kubemesh/proxy-init/test/kubetest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

const (
	appNS    = "app"
	cniNS    = "linkerd-cni"
	cniSA    = "linkerd-cni"
	nodeA    = "node-a"
	nodeB    = "node-b"
	waitLong = 30 * time.Second
)

// startCluster runs kube-apiserver and etcd inside a network namespace of the test's own.
func startCluster(t *testing.T) *kubetest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping in -short mode: starts etcd and kube-apiserver (run `make kube-bins` first)")
	}
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	return kubetest.Start(t, kubetest.Options{NetNSPath: n.Path()})
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// deployClusterRole returns the rules of the ClusterRole linkerd-cni as the chart renders it for
// the repair controller (the agent off, repairController on: Linkerd's linkerd2-cni values), and
// where they come from.
func deployClusterRole(t *testing.T) ([]rbacv1.PolicyRule, string) {
	t.Helper()
	ch, err := helmchart.Load("../..")
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]any{"agent": map[string]any{"enabled": false}, "repairController": map[string]any{"enabled": true}}
	files, err := helmchart.Render(ch, values)
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(files["10-rbac.yaml"], -1) {
		var cr rbacv1.ClusterRole
		if yaml.Unmarshal([]byte(doc), &cr) == nil && cr.Kind == "ClusterRole" && cr.Name == "linkerd-cni" {
			return cr.Rules, fmt.Sprintf("the chart's 10-rbac.yaml with %v", values)
		}
	}
	t.Fatal("the chart renders no ClusterRole linkerd-cni")
	return nil, ""
}

// serviceAccountClient creates a ServiceAccount bound to a ClusterRole with rules, and returns a
// client authenticated as it.
func serviceAccountClient(t *testing.T, c *kubetest.Cluster, sa, role string, rules []rbacv1.PolicyRule) *kubeclient.Client {
	t.Helper()
	client, _ := serviceAccount(t, c, sa, role, rules)
	return client
}

// serviceAccount is serviceAccountClient that also returns the token.
func serviceAccount(t *testing.T, c *kubetest.Cluster, sa, role string, rules []rbacv1.PolicyRule) (*kubeclient.Client, string) {
	t.Helper()
	token, err := c.ServiceAccountToken(ctxFor(t, waitLong), cniNS, sa, role, rules)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubeclient.New(c.ConfigForToken(token))
	if err != nil {
		t.Fatal(err)
	}
	return client, token
}

// podSpec describes a test pod and the validator status a kubelet would report for it.
type podSpec struct {
	name, node   string
	meshed       bool // has the linkerd.io/control-plane-ns label
	finalizer    bool // kept by a finalizer after deletion
	restartNever bool
	state, last  corev1.ContainerState
	wantDeleted  bool
	createdLate  bool // created after the controller is ready (watch, not list)
	failsLate    bool // created healthy, reported failed after the controller is ready
	uid          types.UID
}

func terminated(code int32, id string) corev1.ContainerState {
	return corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
		ExitCode: code, Reason: "Error", ContainerID: "containerd://" + id,
		StartedAt: metav1.Now(), FinishedAt: metav1.Now(),
	}}
}

var running = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}

const testFinalizer = "kubemesh.test/hold"

func createPod(t *testing.T, admin kubernetes.Interface, p *podSpec) {
	t.Helper()
	ctx := ctxFor(t, waitLong)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.name, Namespace: appNS},
		Spec: corev1.PodSpec{
			NodeName:       p.node,
			InitContainers: []corev1.Container{{Name: agent.ValidatorContainer, Image: "validator:test"}},
			Containers:     []corev1.Container{{Name: "app", Image: "app:test"}},
		},
	}
	if p.meshed {
		pod.Labels = map[string]string{agent.ControlPlaneNSLabel: "linkerd"}
	}
	if p.finalizer {
		pod.Finalizers = []string{testFinalizer}
	}
	if p.restartNever {
		pod.Spec.RestartPolicy = corev1.RestartPolicyNever
	}
	created, err := admin.CoreV1().Pods(appNS).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod %s: %v", p.name, err)
	}
	p.uid = created.UID
	state, last := p.state, p.last
	if p.failsLate {
		state, last = terminated(0, p.name+"-ok"), corev1.ContainerState{}
	}
	setStatus(t, admin, p.name, state, last)
}

// setStatus writes the validator's status through the status subresource, as a kubelet does.
func setStatus(t *testing.T, admin kubernetes.Interface, name string, state, last corev1.ContainerState) {
	t.Helper()
	ctx := ctxFor(t, waitLong)
	pod, err := admin.CoreV1().Pods(appNS).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	restarts := int32(0)
	if last.Terminated != nil {
		restarts = 1
	}
	pod.Status.Phase = corev1.PodPending
	pod.Status.InitContainerStatuses = []corev1.ContainerStatus{{
		Name: agent.ValidatorContainer, Image: "validator:test", ImageID: "validator@sha256:0",
		State: state, LastTerminationState: last, RestartCount: restarts,
	}}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: "app", Image: "app:test", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "PodInitializing"}},
	}}
	if _, err := admin.CoreV1().Pods(appNS).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("update status of %s: %v", name, err)
	}
}

// runController starts a controller and stops it at cleanup, returning a function that stops it
// earlier and waits for it.
func runController(t *testing.T, client *kubeclient.Client, node string) (*agent.Agent, func()) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ctrl, err := agent.New(client, repair.AgentOptions(repair.Config{NodeName: node}, log))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("controller Run: %v", err)
			}
		case <-time.After(waitLong):
			t.Errorf("controller did not stop")
		}
	}
	t.Cleanup(stop)
	waitFor(t, "the controller to be ready", func() bool { return get(t, ctrl, "/ready") == http.StatusOK })
	return ctrl, stop
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func get(t *testing.T, ctrl *agent.Agent, path string) int {
	rec := httptest.NewRecorder()
	ctrl.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code
}

// metric returns the value of an unlabelled metric from /metrics.
func metric(t *testing.T, ctrl *agent.Agent, name string) string {
	t.Helper()
	rec := httptest.NewRecorder()
	ctrl.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(string(body))
	if m == nil {
		t.Fatalf("/metrics lacks %s:\n%s", name, body)
	}
	return m[1]
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestRepairAgainstAPIServer(t *testing.T) {
	c := startCluster(t)
	admin := c.Clientset
	ctx := ctxFor(t, 3*time.Minute)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rules, source := deployClusterRole(t)
	t.Logf("RBAC: the controller's ServiceAccount is bound to %s", source)
	sa := serviceAccountClient(t, c, cniSA, "linkerd-cni", rules)

	pods := []*podSpec{
		{name: "failed-current", node: nodeA, meshed: true, state: terminated(95, "a1"), wantDeleted: true},
		{name: "failed-job", node: nodeA, meshed: true, restartNever: true, state: terminated(95, "j1"), wantDeleted: true},
		{name: "failed-last", node: nodeA, meshed: true, state: running, last: terminated(95, "b1"), wantDeleted: true, createdLate: true},
		{name: "fails-later", node: nodeA, meshed: true, state: running, last: terminated(95, "c1"), wantDeleted: true, failsLate: true},
		{name: "held", node: nodeA, meshed: true, finalizer: true, state: terminated(95, "h1"), wantDeleted: true},
		{name: "healthy", node: nodeA, meshed: true, state: terminated(0, "ok")},
		{name: "validator-error-1", node: nodeA, meshed: true, state: terminated(1, "e1")},
		{name: "other-node", node: nodeB, meshed: true, state: terminated(95, "n1")},
		{name: "unmeshed", node: nodeA, state: terminated(95, "u1")},
	}
	for _, p := range pods {
		if !p.createdLate {
			createPod(t, admin, p)
		}
	}
	ctrl, stop := runController(t, sa, nodeA)
	if got := get(t, ctrl, "/live"); got != http.StatusOK {
		t.Errorf("/live = %d", got)
	}
	for _, p := range pods {
		switch {
		case p.createdLate:
			createPod(t, admin, p)
		case p.failsLate:
			setStatus(t, admin, p.name, p.state, p.last)
		}
	}

	gone := func(p *podSpec) bool {
		pod, err := admin.CoreV1().Pods(appNS).Get(ctx, p.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true
		}
		if err != nil {
			t.Fatal(err)
		}
		return pod.DeletionTimestamp != nil // held by its finalizer
	}
	for _, p := range pods {
		if p.wantDeleted {
			waitFor(t, p.name+" to be deleted", func() bool { return gone(p) })
		}
	}

	// A new failure reported for the pod already being deleted must not delete it again.
	setStatus(t, admin, "held", terminated(95, "h2"), terminated(95, "h1"))
	time.Sleep(2 * time.Second) // the controller sees the update within milliseconds
	for _, p := range pods {
		if !p.wantDeleted && gone(p) {
			t.Errorf("pod %s was deleted; it should be left alone", p.name)
		}
	}

	if got := metric(t, ctrl, agent.RepairMetricsPrefix+"deleted_total"); got != "5" {
		t.Errorf("deleted_total = %s, want 5", got)
	}
	for _, name := range []string{"queue_size", "delete_errors_total", "event_errors_total"} {
		if got := metric(t, ctrl, agent.RepairMetricsPrefix+name); got != "0" {
			t.Errorf("%s = %s, want 0", name, got)
		}
	}

	// One Event per deleted pod, naming it by UID; none for the others.
	evs, err := admin.EventsV1().Events(appNS).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	perUID := map[types.UID]int{}
	for _, ev := range evs.Items {
		if ev.Reason != agent.EventReason || ev.Action != agent.EventAction || ev.Type != corev1.EventTypeWarning ||
			ev.ReportingController != agent.EventReportingController || ev.Regarding.Kind != "Pod" ||
			!strings.Contains(ev.Note, "exit code 95") {
			t.Errorf("unexpected event %+v", ev)
		}
		perUID[ev.Regarding.UID]++
	}
	for _, p := range pods {
		want := 0
		if p.wantDeleted {
			want = 1
		}
		if perUID[p.uid] != want {
			t.Errorf("pod %s has %d events, want %d", p.name, perUID[p.uid], want)
		}
	}

	// The ServiceAccount did exactly this: each repaired pod deleted once, events created, the
	// pods of its node listed and watched; nothing refused, nothing else.
	stop() // ends the watch, which is audited when it ends
	user := kubetest.ServiceAccountUser(cniNS, cniSA)
	auditCtx, cancel := context.WithTimeout(ctx, waitLong)
	defer cancel()
	audit, err := c.WaitAuditEvents(auditCtx, user, func(evs []kubetest.AuditEvent) bool {
		return slices.ContainsFunc(evs, func(e kubetest.AuditEvent) bool { return e.Verb == "watch" })
	})
	if err != nil {
		t.Fatal(err)
	}
	deletes := map[string]int{}
	for _, e := range audit {
		if e.Code() >= 400 {
			t.Errorf("request refused: %s %s -> %d", e.Verb, e.RequestURI, e.Code())
		}
		switch op := e.Verb + " " + e.Resource(); op {
		case "delete pods":
			deletes[e.ObjectRef.Name]++
		case "list pods", "watch pods", "create events":
			if op != "create events" && !strings.Contains(e.RequestURI, "fieldSelector=spec.nodeName%3D"+nodeA) {
				t.Errorf("%s without the node's field selector: %s", op, e.RequestURI)
			}
		default:
			t.Errorf("unexpected request: %s %s", e.Verb, e.RequestURI)
		}
	}
	for _, p := range pods {
		want := 0
		if p.wantDeleted {
			want = 1
		}
		if deletes[p.name] != want {
			t.Errorf("pod %s deleted %d times, want %d", p.name, deletes[p.name], want)
		}
	}
	// Let the held pod go.
	if _, err := admin.CoreV1().Pods(appNS).Patch(ctx, "held", types.JSONPatchType,
		[]byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{}); err != nil {
		t.Errorf("release held pod: %v", err)
	}
}

// TestRepairWithoutDeletePermission shows RBAC is enforced and failures are counted and retried:
// the pod stays, delete_errors_total grows, no Event is recorded.
func TestRepairWithoutDeletePermission(t *testing.T) {
	c := startCluster(t)
	admin := c.Clientset
	ctx := ctxFor(t, 2*time.Minute)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	readOnly := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list", "get", "watch"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
	}
	sa := serviceAccountClient(t, c, "read-only", "read-only", readOnly)
	p := &podSpec{name: "failed", node: nodeA, meshed: true, state: terminated(95, "x")}
	createPod(t, admin, p)
	ctrl, _ := runController(t, sa, nodeA)
	waitFor(t, "two refused deletions", func() bool {
		v := metric(t, ctrl, agent.RepairMetricsPrefix+"delete_errors_total")
		return v != "0" && v != "1"
	})
	if got := metric(t, ctrl, agent.RepairMetricsPrefix+"deleted_total"); got != "0" {
		t.Errorf("deleted_total = %s, want 0", got)
	}
	if _, err := admin.CoreV1().Pods(appNS).Get(ctx, p.name, metav1.GetOptions{}); err != nil {
		t.Errorf("pod gone without delete permission: %v", err)
	}
	evs, err := admin.EventsV1().Events(appNS).List(ctx, metav1.ListOptions{})
	if err != nil || len(evs.Items) != 0 {
		t.Errorf("events = %v, %v; want none", evs, err)
	}
}

func TestRemoveNodeTaint(t *testing.T) {
	c := startCluster(t)
	admin := c.Clientset
	ctx := ctxFor(t, 2*time.Minute)
	const key = "kubemesh.test/cni-not-ready"
	other := corev1.Taint{Key: "kubemesh.test/other", Value: "x", Effect: corev1.TaintEffectNoSchedule}
	nodes := []struct {
		name        string
		taints      []corev1.Taint
		wantRemoved bool
		// wantLeft is every stored taint but ours; the API server's TaintNodesByCondition
		// admission adds node.kubernetes.io/not-ready to new nodes, and it must survive too.
		wantLeft []corev1.Taint
	}{
		{name: "tainted", taints: []corev1.Taint{{Key: key, Effect: corev1.TaintEffectNoSchedule}, other, {Key: key, Effect: corev1.TaintEffectNoExecute}}, wantRemoved: true},
		{name: "only-ours", taints: []corev1.Taint{{Key: key, Effect: corev1.TaintEffectNoSchedule}}, wantRemoved: true},
		{name: "untainted", taints: []corev1.Taint{other}},
		{name: "bare"},
	}
	for i, n := range nodes {
		created, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}, Spec: corev1.NodeSpec{Taints: n.taints}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range created.Spec.Taints {
			if tn.Key != key {
				nodes[i].wantLeft = append(nodes[i].wantLeft, tn)
			}
		}
		isOther := func(tn corev1.Taint) bool { return tn.Key == other.Key }
		if slices.ContainsFunc(n.taints, isOther) != slices.ContainsFunc(nodes[i].wantLeft, isOther) {
			t.Fatalf("node %s stored without the other taint: %v", n.name, created.Spec.Taints)
		}
	}
	// Exactly the RBAC the installer needs for --node-taint: nodes get and patch.
	sa := serviceAccountClient(t, c, "taint", "taint", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "patch"}},
	})
	for _, n := range nodes {
		t.Run(n.name, func(t *testing.T) {
			removed, err := repair.RemoveNodeTaint(ctx, sa, n.name, key)
			if err != nil || removed != n.wantRemoved {
				t.Fatalf("RemoveNodeTaint = %v, %v; want %v", removed, err, n.wantRemoved)
			}
			got, err := admin.CoreV1().Nodes().Get(ctx, n.name, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got.Spec.Taints) != fmt.Sprint(n.wantLeft) {
				t.Errorf("taints left %v, want %v", got.Spec.Taints, n.wantLeft)
			}
			// Idempotent: a second call (an installer restart) finds nothing to do.
			if removed, err := repair.RemoveNodeTaint(ctx, sa, n.name, key); err != nil || removed {
				t.Errorf("second RemoveNodeTaint = %v, %v; want false, nil", removed, err)
			}
		})
	}
	if _, err := repair.RemoveNodeTaint(ctx, sa, "missing", key); !apierrors.IsNotFound(err) {
		t.Errorf("RemoveNodeTaint on a missing node = %v, want NotFound", err)
	}
}
