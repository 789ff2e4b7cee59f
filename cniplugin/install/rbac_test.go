package install

// The linkerd-cni ServiceAccount against a real kube-apiserver, for every rendering: its RBAC
// objects and admission policies applied for real, a token bound to a pod on a node (as the
// kubelet projects it, so the API server names the node in the token's user extra), and the
// requests the code makes, through the code's own client: what each rule grants works, and what
// lies beside it (another Service, another DaemonSet, a pod on another node) is refused.

import (
	"cmp"
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/test/kubetest"
)

// accessKinds are the kinds of the objects that make up the ServiceAccount's access.
var accessKinds = []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
	"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}

// isAccess says whether m is one of the objects that make up the ServiceAccount's access.
func isAccess(m manifest) bool { return slices.Contains(accessKinds, m.obj.GetKind()) }

// The nodes of the permission checks: the token's pod runs on ownNode.
const (
	ownNode   = "rbac-node"
	otherNode = "rbac-node-2"
)

// checkPermissions applies the rendering's access objects, then the optional node-taint ones
// (deploy/ only), checking the ServiceAccount after each. Everything it creates is deleted again,
// so that the next rendering's dry run finds nothing.
func checkPermissions(ctx context.Context, t *testing.T, cluster *kubetest.Cluster, c *apiClient, r rendering, ms []manifest) {
	optional := func(m manifest) bool { return filepath.Base(filepath.Dir(m.file)) == "optional" }
	var applied []manifest
	t.Cleanup(func() {
		for _, m := range applied {
			gvk := m.obj.GroupVersionKind()
			mp, _ := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			var ri dynamic.ResourceInterface = c.dyn.Resource(mp.Resource)
			if mp.Scope.Name() == meta.RESTScopeNameNamespace {
				ri = c.dyn.Resource(mp.Resource).Namespace(m.obj.GetNamespace())
			}
			if err := ri.Delete(ctx, m.obj.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Errorf("delete %s: %v", m, err)
			}
		}
	})
	apply := func(withOptional bool) {
		t.Helper()
		for _, m := range ms {
			if isAccess(m) && optional(m) == withOptional {
				if _, err := c.apply(ctx, m.obj, false); err != nil {
					t.Fatalf("apply %s: %v", m, err)
				}
				applied = append(applied, m)
			}
		}
	}
	apply(false)
	w := newAccessWorld(ctx, t, cluster, c.cs)
	a := access{deletes: r.deletes, events: r.second != "", watchesPods: r.second != "",
		watchesNamespaces: r.second == "agent" && !(r.noLookups && r.noAudits)}
	t.Run("base RBAC", func(t *testing.T) { w.check(ctx, t, r.name, a) })
	if r.values == nil {
		apply(true)
		a.nodeTaint = true
		t.Run("with optional/node-taint-rbac.yaml", func(t *testing.T) { w.check(ctx, t, r.name+".node-taint", a) })
	}
}

// access is what a rendering grants beyond the plugin's reads.
type access struct {
	nodeTaint         bool // get and patch nodes (the optional RBAC)
	deletes           bool // delete pods on the token's node (the agent's delete mode, the repair controller)
	events            bool // create events (the agent, the repair controller)
	watchesPods       bool // list and watch pods (the agent, the repair controller)
	watchesNamespaces bool // list and watch namespaces and default/kubernetes (the agent's lookups and audits)
}

// accessWorld is the ServiceAccount's installer pod, owned by the DaemonSet linkerd-cni on
// ownNode, a token bound to it, and the objects the checks read and delete.
type accessWorld struct {
	admin kubernetes.Interface
	sa    kubernetes.Interface // the token's, with client-go's typed clients
	kc    *kubeclient.Client   // the token's, with the DaemonSet's own client
	// unbound is a TokenRequest token bound to no pod, hence to no node.
	unbound      kubernetes.Interface
	installerPod string // the installer pod's name
}

func newAccessWorld(ctx context.Context, t *testing.T, cluster *kubetest.Cluster, admin kubernetes.Interface) *accessWorld {
	t.Helper()
	w := &accessWorld{admin: admin, installerPod: "linkerd-cni-installer"}
	for _, n := range []string{ownNode, otherNode} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	// default/kubernetes, and another Service beside it.
	for _, name := range []string{"kubernetes", "other"} {
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
			Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "https", Port: 443}}}}
		if _, err := admin.CoreV1().Services("default").Create(ctx, svc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	labels := map[string]string{"k8s-app": "linkerd-cni"}
	tmpl := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{ServiceAccountName: "linkerd-cni", Containers: []corev1.Container{{Name: "install-cni", Image: "registry.invalid/linkerd-cni:1"}}}}
	var owner *appsv1.DaemonSet
	for _, name := range []string{"linkerd-cni", "other"} {
		ds, err := admin.AppsV1().DaemonSets("linkerd-cni").Create(ctx, &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: tmpl}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		owner = cmp.Or(owner, ds)
		t.Cleanup(func() { _ = admin.AppsV1().DaemonSets("linkerd-cni").Delete(ctx, name, metav1.DeleteOptions{}) })
	}
	yes := true
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: w.installerPod, Namespace: "linkerd-cni", Labels: labels,
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "DaemonSet", Name: owner.Name, UID: owner.UID, Controller: &yes}}},
		Spec: tmpl.Spec}
	pod.Spec.NodeName = ownNode
	token := tokenBoundTo(ctx, t, admin, pod)
	t.Cleanup(func() { deleteNow(ctx, admin, pod) })
	var err error
	if w.sa, err = kubernetes.NewForConfig(cluster.ConfigForToken(token)); err != nil {
		t.Fatal(err)
	}
	if w.kc, err = kubeclient.New(cluster.ConfigForToken(token)); err != nil {
		t.Fatal(err)
	}
	unbound, err := cluster.TokenFor(ctx, "linkerd-cni", "linkerd-cni")
	if err != nil {
		t.Fatal(err)
	}
	if w.unbound, err = kubernetes.NewForConfig(cluster.ConfigForToken(unbound)); err != nil {
		t.Fatal(err)
	}
	return w
}

// tokenBoundTo creates pod and mints a token for its ServiceAccount bound to it, like the
// kubelet's projected token: the API server then names the pod's node in the token's user extra
// (authentication.kubernetes.io/node-name), which the chart's admission policies check.
func tokenBoundTo(ctx context.Context, t *testing.T, cs kubernetes.Interface, pod *corev1.Pod) string {
	t.Helper()
	pod, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(pod.Namespace).CreateToken(ctx, pod.Spec.ServiceAccountName, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &exp, BoundObjectRef: &authenticationv1.BoundObjectReference{
			Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token bound to pod %s: %v", pod.Name, err)
	}
	return tr.Status.Token
}

// deleteNow deletes a pod at once: without a kubelet, a pod on a node is never gone otherwise.
func deleteNow(ctx context.Context, admin kubernetes.Interface, p *corev1.Pod) {
	_ = admin.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
}

// forbidden fails unless err is a Forbidden answer.
func forbidden(t *testing.T, what string, err error) {
	t.Helper()
	if !apierrors.IsForbidden(err) {
		t.Errorf("%s: got %v, want Forbidden", what, err)
	}
}

// allowed fails if err is anything but success or, with notFound, a NotFound answer.
func allowed(t *testing.T, what string, err error, notFound bool) {
	t.Helper()
	if err != nil && !(notFound && apierrors.IsNotFound(err)) {
		t.Errorf("%s: %v", what, err)
	}
}

func (w *accessWorld) check(ctx context.Context, t *testing.T, run string, a access) {
	w.checkReads(ctx, t, a)
	w.checkInstaller(ctx, t)
	w.checkEvents(ctx, t, run, a)
	w.checkDeletes(ctx, t, run, a)
	w.checkRefusals(ctx, t, a)
	w.checkMatrix(ctx, t, a)
}

// checkReads makes the plugin's and the agent's reads, as they make them.
func (w *accessWorld) checkReads(ctx context.Context, t *testing.T, a access) {
	// The plugin: the pod, its namespace, default/kubernetes.
	_, err := w.kc.Pods("linkerd-cni").Get(ctx, w.installerPod, metav1.GetOptions{})
	allowed(t, "get pod", err, false)
	_, err = w.kc.Namespaces().Get(ctx, "linkerd-cni", metav1.GetOptions{})
	allowed(t, "get namespace", err, false)
	_, err = w.kc.Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	allowed(t, "get service default/kubernetes", err, false)

	// The agent's watches (kubeclient's Informer lists, then watches): its node's pods, the
	// namespaces, default/kubernetes alone.
	type listWatch interface {
		list(context.Context, metav1.ListOptions) error
		watch(context.Context, metav1.ListOptions) error
	}
	watches := []struct {
		what string
		ok   bool
		r    listWatch
		opts metav1.ListOptions
	}{
		{"the node's pods", a.watchesPods, lw[*corev1.Pod, *corev1.PodList]{w.kc.Pods("")},
			metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", ownNode).String()}},
		{"namespaces", a.watchesNamespaces, lw[*corev1.Namespace, *corev1.NamespaceList]{w.kc.Namespaces()}, metav1.ListOptions{}},
		{"service default/kubernetes", a.watchesNamespaces, lw[*corev1.Service, *corev1.ServiceList]{w.kc.Services("default")},
			metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("metadata.name", "kubernetes").String()}},
	}
	for _, wt := range watches {
		lerr, werr := wt.r.list(ctx, wt.opts), wt.r.watch(ctx, wt.opts)
		if wt.ok {
			allowed(t, "list "+wt.what, lerr, false)
			allowed(t, "watch "+wt.what, werr, false)
		} else {
			forbidden(t, "list "+wt.what+" without the agent's watch", lerr)
			forbidden(t, "watch "+wt.what+" without the agent's watch", werr)
		}
	}
}

// lw lists and watches with a kubeclient.Resource, as its Informer does.
type lw[T, L runtime.Object] struct{ r kubeclient.Resource[T, L] }

func (l lw[T, L]) list(ctx context.Context, o metav1.ListOptions) error {
	_, err := l.r.List(ctx, o)
	return err
}

func (l lw[T, L]) watch(ctx context.Context, o metav1.ListOptions) error {
	w, err := l.r.Watch(ctx, o)
	if err == nil {
		w.Stop()
	}
	return err
}

// checkInstaller makes the installer's SIGTERM reads: its pod, its DaemonSet, which stays, and
// its node, which the DaemonSet still targets.
func (w *accessWorld) checkInstaller(ctx context.Context, t *testing.T) {
	if keep, why := daemonSetStays(ctx, w.kc, "linkerd-cni", w.installerPod, ""); !keep || !strings.Contains(why, "still targets node "+ownNode) {
		t.Errorf("the installer's SIGTERM check: %v, %s; want its DaemonSet and its node read", keep, why)
	}
	_, err := w.kc.DaemonSets("linkerd-cni").Get(ctx, "other", metav1.GetOptions{})
	forbidden(t, "get another DaemonSet", err)
	_, err = w.kc.DaemonSets("linkerd-cni").List(ctx, metav1.ListOptions{})
	forbidden(t, "list DaemonSets", err)
	_, err = w.kc.DaemonSets("default").Get(ctx, "linkerd-cni", metav1.GetOptions{})
	forbidden(t, "get a DaemonSet linkerd-cni of another namespace", err)
}

// checkEvents records an Event as the agent does (events.k8s.io/v1, create): granted with the
// agent or the repair controller, and nothing else on Events ever.
func (w *accessWorld) checkEvents(ctx context.Context, t *testing.T, run string, a access) {
	ev := &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "victim." + run, Namespace: "default"}, // an Event outlives the pod
		EventTime: metav1.NowMicro(), ReportingController: "linkerd.io/cni-agent",
		ReportingInstance: "test", Action: "RewriteRules", Reason: "RedirectRepaired", Type: "Warning",
		Regarding: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "victim"}}
	_, err := w.kc.Events("default").Create(ctx, ev, metav1.CreateOptions{})
	if a.events {
		allowed(t, "create event", err, false)
	} else {
		forbidden(t, "create event without the agent or the repair controller", err)
	}
	_, err = w.kc.Events("default").Patch(ctx, ev.Name, types.MergePatchType, []byte(`{"note":"x"}`), metav1.PatchOptions{})
	forbidden(t, "patch event", err)
	_, err = w.sa.EventsV1().Events("default").List(ctx, metav1.ListOptions{})
	forbidden(t, "list events", err)
	_, err = w.sa.CoreV1().Events("default").Create(ctx, &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "victim.2"},
		InvolvedObject: corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: "victim"}}, metav1.CreateOptions{})
	forbidden(t, "create core/v1 event", err)
}

// podDeleteDenied starts the message of the chart's pod-delete policy.
const podDeleteDenied = "linkerd-cni may delete only pods on the node its pod runs on"

// checkDeletes deletes pods as the agent's delete mode does (grace period 0, UID precondition):
// only where a rendering deletes, and there only the pods of the token's own node.
func (w *accessWorld) checkDeletes(ctx context.Context, t *testing.T, run string, a access) {
	victim := func(node string) *corev1.Pod {
		p, err := w.admin.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: strings.ReplaceAll("victim-"+run+"-"+node, ".", "-")},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/c:1"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { deleteNow(ctx, w.admin, p) })
		return p
	}
	own, other := victim(ownNode), victim(otherNode)
	zero := int64(0)
	del := func(c *kubeclient.Client, p *corev1.Pod, dryRun bool) error {
		opts := metav1.DeleteOptions{GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &p.UID}}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		return c.Pods(p.Namespace).Delete(ctx, p.Name, opts)
	}
	if !a.deletes {
		forbidden(t, "delete pod without the repair controller or the agent's delete mode", del(w.kc, own, false))
		return
	}
	// A policy takes effect once the API server has loaded it: wait for its denial.
	waitFor(t, 30*time.Second, "the pod-delete policy to be in force", func() (bool, string) {
		err := del(w.kc, other, true)
		return err != nil && strings.Contains(err.Error(), podDeleteDenied), fmt.Sprint(err)
	})
	wantDenied := func(what string, err error, msg string) {
		t.Helper()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), msg) {
			t.Errorf("%s: got %v, want Forbidden: ...%s", what, err, msg)
		}
	}
	wantDenied("delete a pod on another node", del(w.kc, other, false), fmt.Sprintf(
		`%s: this token is bound to node %q, pod default/%s is on %q`, podDeleteDenied, ownNode, other.Name, otherNode))
	wantDenied("delete with a token bound to no node", w.unbound.CoreV1().Pods("default").Delete(ctx, own.Name, metav1.DeleteOptions{}),
		fmt.Sprintf(`%s: this token is bound to node "", pod default/%s is on %q`, podDeleteDenied, own.Name, ownNode))
	allowed(t, "delete a pod on the token's node", del(w.kc, own, false), false)
	if _, err := w.admin.CoreV1().Pods("default").Get(ctx, own.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the pod on the token's node is still there after its deletion: %v", err)
	}
	if _, err := w.admin.CoreV1().Pods("default").Get(ctx, other.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the pod on the other node: %v", err)
	}
}

// checkRefusals sends real requests just beside what is granted.
func (w *accessWorld) checkRefusals(ctx context.Context, t *testing.T, a access) {
	_, err := w.kc.Services("default").Get(ctx, "other", metav1.GetOptions{})
	forbidden(t, "get another service", err)
	_, err = w.kc.Services("default").List(ctx, metav1.ListOptions{})
	forbidden(t, "list the services of default", err)
	_, err = w.kc.Services("kube-system").Get(ctx, "kubernetes", metav1.GetOptions{})
	forbidden(t, "get a service kubernetes of another namespace", err)
	_, err = w.sa.CoreV1().Secrets("linkerd-cni").List(ctx, metav1.ListOptions{})
	forbidden(t, "list secrets", err)
	_, err = w.sa.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	forbidden(t, "list secrets in all namespaces", err)
	_, err = w.sa.CoreV1().ConfigMaps("linkerd-cni").Get(ctx, "linkerd-cni-config", metav1.GetOptions{})
	forbidden(t, "get configmap", err)
	_, err = w.sa.CoreV1().Pods("default").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "x"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "i"}}}}, metav1.CreateOptions{})
	forbidden(t, "create pod", err)
	_, err = w.kc.Pods("linkerd-cni").Patch(ctx, w.installerPod, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{})
	forbidden(t, "patch pod", err)
	err = w.sa.CoreV1().Namespaces().Delete(ctx, "default", metav1.DeleteOptions{})
	forbidden(t, "delete namespace", err)
	// Nodes: a get (the installer's SIGTERM check), a patch (what --node-taint sends) only with
	// the optional RBAC; never a list, a delete, an update or a status write.
	_, err = w.sa.CoreV1().Nodes().Get(ctx, ownNode, metav1.GetOptions{})
	allowed(t, "get node", err, false)
	_, err = w.sa.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	forbidden(t, "list nodes", err)
	_, err = w.sa.CoreV1().Nodes().Patch(ctx, ownNode, types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{})
	if a.nodeTaint {
		allowed(t, "patch node with the optional RBAC", err, false)
	} else {
		forbidden(t, "patch node", err)
	}
	_, err = w.sa.CoreV1().Nodes().PatchStatus(ctx, ownNode, []byte(`{"status":{"phase":"Running"}}`))
	forbidden(t, "patch node status", err)
	err = w.sa.CoreV1().Nodes().Delete(ctx, ownNode, metav1.DeleteOptions{})
	forbidden(t, "delete node", err)
}

// checkMatrix asks SelfSubjectAccessReviews for every verb on the resources near the grants.
func (w *accessWorld) checkMatrix(ctx context.Context, t *testing.T, a access) {
	type res struct{ namespace, group, resource, name string }
	resources := []res{{"default", "", "pods", ""}, {"default", "", "namespaces", ""}, {"default", "", "services", ""},
		{"default", "", "services", "kubernetes"}, {"kube-system", "", "services", "kubernetes"}, {"default", "", "nodes", ""},
		{"default", "", "secrets", ""}, {"default", "", "configmaps", ""}, {"default", "", "serviceaccounts", ""},
		{"default", "", "events", ""}, {"default", "events.k8s.io", "events", ""}, {"default", "", "pods/exec", ""},
		{"default", "", "pods/eviction", ""}, {"default", "", "serviceaccounts/token", ""}, {"default", "", "nodes/status", ""},
		{"default", "", "nodes/proxy", ""}, {"default", "apps", "daemonsets", ""}, {"linkerd-cni", "apps", "daemonsets", ""},
		{"linkerd-cni", "apps", "daemonsets", "linkerd-cni"},
		{"", "rbac.authorization.k8s.io", "clusterroles", ""}, {"", "rbac.authorization.k8s.io", "clusterrolebindings", ""}}
	verbs := []string{"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection",
		"escalate", "bind", "impersonate"}
	for _, r := range resources {
		for _, v := range verbs {
			base, sub, _ := strings.Cut(r.resource, "/")
			listOrWatch := v == "list" || v == "watch"
			want := false
			switch {
			case sub != "":
			case r.group == "" && base == "pods":
				want = v == "get" || (listOrWatch && a.watchesPods) || (v == "delete" && a.deletes)
			case r.group == "" && base == "namespaces":
				want = v == "get" || (listOrWatch && a.watchesNamespaces)
			case r.group == "" && base == "services":
				want = r.namespace == "default" && r.name == "kubernetes" && (v == "get" || (listOrWatch && a.watchesNamespaces))
			case r.group == "" && base == "nodes":
				// get: the installer's SIGTERM check (does the DaemonSet still target the node?).
				want = v == "get" || (v == "patch" && a.nodeTaint)
			case r.group == "events.k8s.io":
				want = v == "create" && a.events
			case r.group == "apps":
				want = r.namespace == "linkerd-cni" && r.name == "linkerd-cni" && v == "get"
			}
			review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
				ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: r.namespace, Verb: v,
					Group: r.group, Resource: base, Subresource: sub, Name: r.name}}}
			got, err := w.sa.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, review, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("access review: %v", err)
			}
			if got.Status.Allowed != want {
				t.Errorf("%s %s/%s %s in %q: allowed=%v, want %v", v, r.group, r.resource, r.name, r.namespace, got.Status.Allowed, want)
			}
		}
	}
}
