package install

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/internal/kubetest"
)

// TestDaemonSetStays, against a real kube-apiserver: only a DaemonSet that still exists, is the
// pod's controller and is not being deleted keeps the plugin in place at SIGTERM; every other
// answer, an API error included, uninstalls.
func TestDaemonSetStays(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: starts kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns = "linkerd-cni"
	cluster := kubetest.Start(t, kubetest.Options{})
	admin := cluster.Clientset
	// The installer's own reads, pods and DaemonSets; "no-ds" may read pods only.
	client := func(name string, rules []rbacv1.PolicyRule) *kubeclient.Client {
		token, err := cluster.ServiceAccountToken(ctx, ns, name, name, rules)
		if err != nil {
			t.Fatal(err)
		}
		c, err := kubeclient.New(cluster.ConfigForToken(token))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	installer := client("installer", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get"}},
	})
	podsOnly := client("no-ds", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}})

	labels := map[string]string{"app": "linkerd-cni"}
	template := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "install", Image: "cni:test"}}}}
	daemonSet := func(name string, finalizers ...string) *appsv1.DaemonSet {
		ds, err := admin.AppsV1().DaemonSets(ns).Create(ctx, &appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Name: name, Finalizers: finalizers},
			Spec:       appsv1.DaemonSetSpec{Selector: &metav1.LabelSelector{MatchLabels: labels}, Template: template},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	yes := true
	pod := func(name string, owner *metav1.OwnerReference) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: template.Spec}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		if _, err := admin.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	controlledBy := func(ds *appsv1.DaemonSet) *metav1.OwnerReference {
		return &metav1.OwnerReference{APIVersion: "apps/v1", Kind: "DaemonSet", Name: ds.Name, UID: ds.UID, Controller: &yes}
	}

	current := daemonSet("linkerd-cni")
	pod("upgraded", controlledBy(current))
	gone := controlledBy(current)
	gone.Name = "deleted"
	pod("orphaned", gone)
	// Its finalizer holds it with a deletion timestamp, as a foreground deletion does.
	deleting := daemonSet("deleting", "kubemesh.test/hold")
	if err := admin.AppsV1().DaemonSets(ns).Delete(ctx, deleting.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	pod("uninstalling", controlledBy(deleting))
	replaced := controlledBy(current)
	replaced.UID = "an-earlier-daemonset"
	pod("left-over", replaced)
	pod("bare", nil)

	for _, tt := range []struct {
		name, pod string
		client    *kubeclient.Client
		keep      bool
		wantWhy   string
	}{
		{"upgrade", "upgraded", installer, true, "DaemonSet linkerd-cni/linkerd-cni stays"},
		{"uninstall, DaemonSet gone", "orphaned", installer, false, "DaemonSet linkerd-cni/deleted is gone: uninstall"},
		{"uninstall, foreground deletion", "uninstalling", installer, false, "DaemonSet linkerd-cni/deleting is being deleted: uninstall"},
		{"DaemonSet recreated under the same name", "left-over", installer, false, "DaemonSet linkerd-cni/linkerd-cni was replaced by another"},
		{"pod without a DaemonSet", "bare", installer, false, "pod linkerd-cni/bare is not controlled by a DaemonSet"},
		{"pod gone", "missing", installer, false, `get pod linkerd-cni/missing: pods "missing" not found`},
		{"API error", "upgraded", podsOnly, false, `get DaemonSet linkerd-cni/linkerd-cni: daemonsets.apps "linkerd-cni" is forbidden`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			keep, why := daemonSetStays(ctx, tt.client, ns, tt.pod)
			if keep != tt.keep || !strings.Contains(why, tt.wantWhy) {
				t.Errorf("daemonSetStays = %v, %q; want %v, %q", keep, why, tt.keep, tt.wantWhy)
			}
		})
	}
}
