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
	"github.com/kubemesh/proxy-init/test/kubetest"
)

// TestDaemonSetStays, against a real kube-apiserver: only a DaemonSet that still exists, is the
// pod's controller, is not being deleted and still targets the pod's node keeps the plugin in
// place at SIGTERM. A node relabelled out of its nodeSelector or required node affinity, or
// tainted with a taint it does not tolerate, uninstalls, as does every other answer, an API error
// included, except a failed read of the node itself (kept: it is most likely an upgrade).
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
		{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
	})
	noNodes := client("no-nodes", []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}},
		{APIGroups: []string{"apps"}, Resources: []string{"daemonsets"}, Verbs: []string{"get"}},
	})
	podsOnly := client("no-ds", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}})

	labels := map[string]string{"app": "linkerd-cni"}
	// The chart's kind of targeting: a nodeSelector, a required node affinity and a toleration.
	template := corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "install", Image: "cni:test"}},
			HostNetwork:  true,
			NodeSelector: map[string]string{"kubemesh.test/cni": "yes"},
			Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
				NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
					{Key: "kubernetes.io/os", Operator: corev1.NodeSelectorOpIn, Values: []string{"linux"}}}}}}}},
			Tolerations: []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
		}}
	node := func(name string, labels map[string]string, taints ...corev1.Taint) {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: corev1.NodeSpec{Taints: taints}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The API server gives every new Node the taint node.kubernetes.io/not-ready:NoSchedule (no
	// node controller runs here to lift it): a node's condition, tolerated as the node coming back.
	targeted := map[string]string{"kubemesh.test/cni": "yes", "kubernetes.io/os": "linux"}
	node("in", targeted)
	node("relabelled", map[string]string{"kubernetes.io/os": "linux"})
	node("windows", map[string]string{"kubemesh.test/cni": "yes", "kubernetes.io/os": "windows"})
	node("tainted", targeted, corev1.Taint{Key: "gpu", Value: "true", Effect: corev1.TaintEffectNoExecute})
	node("prefer-not", targeted, corev1.Taint{Key: "gpu", Effect: corev1.TaintEffectPreferNoSchedule})
	// Tolerated by the template, and (a cordon, a not-ready node) by every daemon pod.
	node("cordoned", targeted, corev1.Taint{Key: "dedicated", Value: "cni", Effect: corev1.TaintEffectNoSchedule},
		corev1.Taint{Key: corev1.TaintNodeUnschedulable, Effect: corev1.TaintEffectNoSchedule},
		corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoExecute},
		corev1.Taint{Key: corev1.TaintNodeNetworkUnavailable, Effect: corev1.TaintEffectNoSchedule})
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
	pod := func(name string, owner *metav1.OwnerReference, nodeName ...string) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: *template.Spec.DeepCopy()}
		if len(nodeName) > 0 {
			p.Spec.NodeName = nodeName[0]
		}
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
	pod("upgraded", controlledBy(current), "in")
	for _, n := range []string{"relabelled", "windows", "tainted", "prefer-not", "cordoned", "no-such-node"} {
		pod("on-"+n, controlledBy(current), n)
	}
	pod("unscheduled", controlledBy(current))
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
		{"upgrade", "upgraded", installer, true, "DaemonSet linkerd-cni/linkerd-cni stays and still targets node in"},
		{"node relabelled out of the nodeSelector", "on-relabelled", installer, false,
			"DaemonSet linkerd-cni/linkerd-cni no longer targets node relabelled (its nodeSelector or required node affinity does not match"},
		{"node out of the required affinity", "on-windows", installer, false, "no longer targets node windows (its nodeSelector or required node affinity"},
		{"untolerated NoExecute taint", "on-tainted", installer, false, "no longer targets node tainted (it does not tolerate the node's taint gpu=true:NoExecute)"},
		{"PreferNoSchedule taint is no bar", "on-prefer-not", installer, true, "still targets node prefer-not"},
		{"tolerated and daemon-pod taints", "on-cordoned", installer, true, "still targets node cordoned"},
		{"node gone: kept", "on-no-such-node", installer, true, `get node no-such-node failed (nodes "no-such-node" not found): kept`},
		{"node read refused: kept", "upgraded", noNodes, true, `get node in failed (nodes "in" is forbidden`},
		{"pod names no node: kept", "unscheduled", installer, true, "the pod names no node"},
		{"uninstall, DaemonSet gone", "orphaned", installer, false, "DaemonSet linkerd-cni/deleted is gone: uninstall"},
		{"uninstall, foreground deletion", "uninstalling", installer, false, "DaemonSet linkerd-cni/deleting is being deleted: uninstall"},
		{"DaemonSet recreated under the same name", "left-over", installer, false, "DaemonSet linkerd-cni/linkerd-cni was replaced by another"},
		{"pod without a DaemonSet", "bare", installer, false, "pod linkerd-cni/bare is not controlled by a DaemonSet"},
		{"pod gone", "missing", installer, false, `get pod linkerd-cni/missing: pods "missing" not found`},
		{"API error", "upgraded", podsOnly, false, `get DaemonSet linkerd-cni/linkerd-cni: daemonsets.apps "linkerd-cni" is forbidden`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			keep, why := daemonSetStays(ctx, tt.client, ns, tt.pod, "")
			if keep != tt.keep || !strings.Contains(why, tt.wantWhy) {
				t.Errorf("daemonSetStays = %v, %q; want %v, %q", keep, why, tt.keep, tt.wantWhy)
			}
		})
	}
}

// TestTargetsNode: the matching is the scheduler's own, without an API server: matchFields on
// metadata.name, operators, and a toleration by value and effect.
func TestTargetsNode(t *testing.T) {
	ds := &appsv1.DaemonSet{Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{
				{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"by-name"}}}},
				{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"gpu"}}}},
			}}}},
		Tolerations: []corev1.Toleration{{Key: "team", Operator: corev1.TolerationOpEqual, Value: "net", Effect: corev1.TaintEffectNoExecute}},
	}}}}
	node := func(name string, labels map[string]string, taints ...corev1.Taint) *corev1.Node {
		return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Spec: corev1.NodeSpec{Taints: taints}}
	}
	for _, tt := range []struct {
		node *corev1.Node
		want bool
		why  string
	}{
		{node("by-name", map[string]string{"pool": "gpu"}), true, ""},
		{node("n1", map[string]string{"pool": "web"}), true, ""},
		{node("n2", map[string]string{"pool": "gpu"}), false, "its nodeSelector or required node affinity does not match the node (labels, name)"},
		{node("n3", nil, corev1.Taint{Key: "team", Value: "net", Effect: corev1.TaintEffectNoExecute}), true, ""},
		{node("n4", nil, corev1.Taint{Key: "team", Value: "db", Effect: corev1.TaintEffectNoExecute}), false, "it does not tolerate the node's taint team=db:NoExecute"},
		{node("n5", nil, corev1.Taint{Key: "team", Value: "net", Effect: corev1.TaintEffectNoSchedule}), false, "it does not tolerate the node's taint team=net:NoSchedule"},
		{node("n6", nil, corev1.Taint{Key: corev1.TaintNodeUnreachable, Effect: corev1.TaintEffectNoSchedule}), true, ""},
	} {
		got, why := targetsNode(ds, tt.node)
		if got != tt.want || why != tt.why {
			t.Errorf("node %s: targetsNode = %v, %q; want %v, %q", tt.node.Name, got, why, tt.want, tt.why)
		}
	}
}
