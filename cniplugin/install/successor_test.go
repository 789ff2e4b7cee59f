package install

import (
	"context"
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestDaemonSetStays: only a DaemonSet that still exists, is the pod's controller and is not
// being deleted keeps the plugin in place at SIGTERM; every other answer, an API error
// included, uninstalls.
func TestDaemonSetStays(t *testing.T) {
	yes := true
	ds := func(mut func(*appsv1.DaemonSet)) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{ObjectMeta: metav1.ObjectMeta{Name: "linkerd-cni", Namespace: "linkerd-cni", UID: "ds-uid"}}
		if mut != nil {
			mut(d)
		}
		return d
	}
	pod := func(owner *metav1.OwnerReference) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "linkerd-cni-x", Namespace: "linkerd-cni"}}
		if owner != nil {
			p.OwnerReferences = []metav1.OwnerReference{*owner}
		}
		return p
	}
	owned := &metav1.OwnerReference{Kind: "DaemonSet", Name: "linkerd-cni", UID: types.UID("ds-uid"), Controller: &yes}
	now := metav1.Now()
	for _, tt := range []struct {
		name    string
		objs    []runtime.Object
		getErr  error // for every get of a DaemonSet
		keep    bool
		wantWhy string
	}{
		{"upgrade", []runtime.Object{pod(owned), ds(nil)}, nil, true, "DaemonSet linkerd-cni/linkerd-cni stays"},
		{"uninstall, DaemonSet gone", []runtime.Object{pod(owned)}, nil, false, "DaemonSet linkerd-cni/linkerd-cni is gone: uninstall"},
		{"uninstall, foreground deletion", []runtime.Object{pod(owned), ds(func(d *appsv1.DaemonSet) {
			d.DeletionTimestamp, d.Finalizers = &now, []string{"foregroundDeletion"}
		})}, nil, false, "is being deleted: uninstall"},
		{"DaemonSet recreated under the same name", []runtime.Object{pod(owned), ds(func(d *appsv1.DaemonSet) { d.UID = "other" })}, nil, false, "was replaced by another"},
		{"pod without a DaemonSet", []runtime.Object{pod(nil), ds(nil)}, nil, false, "is not controlled by a DaemonSet"},
		{"pod gone", nil, nil, false, "get pod linkerd-cni/linkerd-cni-x"},
		{"API error", []runtime.Object{pod(owned), ds(nil)}, errors.New("connection refused"), false, "get DaemonSet linkerd-cni/linkerd-cni: connection refused"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			client := fake.NewSimpleClientset(tt.objs...)
			if tt.getErr != nil {
				client.PrependReactor("get", "daemonsets", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, tt.getErr
				})
			}
			keep, why := daemonSetStays(context.Background(), client, "linkerd-cni", "linkerd-cni-x")
			if keep != tt.keep || !strings.Contains(why, tt.wantWhy) {
				t.Errorf("daemonSetStays = %v, %q; want %v, %q", keep, why, tt.keep, tt.wantWhy)
			}
		})
	}
}
