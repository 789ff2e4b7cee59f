package install

import (
	"cmp"
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1helpers "k8s.io/component-helpers/scheduling/corev1"
	"k8s.io/component-helpers/scheduling/corev1/nodeaffinity"
	"k8s.io/klog/v2"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
)

// successorTimeout bounds successorComing's requests: the grace period must cover the removal.
const successorTimeout = 5 * time.Second

// successorComing tells, at SIGTERM, whether another installer pod will take over this node: the
// pod's DaemonSet still exists, is not being deleted and still targets this node (an upgrade, a
// restart, a deleted pod). Everything then stays, so no pod starts unmeshed in between (ADDs fail
// closed until the next installer's kubeconfig). Otherwise no installer would come back, and the
// dead token would fail every ADD on the node forever: everything goes. why says which.
func (in *installer) successorComing(ctx context.Context) (keep bool, why string) {
	if in.cfg.PodName == "" {
		return false, "POD_NAME not set: cannot tell an upgrade from an uninstall"
	}
	client, err := kubeclient.New(in.cfg.restConfig())
	if err != nil {
		return false, err.Error()
	}
	ctx, cancel := context.WithTimeout(ctx, successorTimeout)
	defer cancel()
	return daemonSetStays(ctx, client, in.cfg.Namespace, in.cfg.PodName, in.cfg.NodeName)
}

// daemonSetStays looks up the pod's controlling DaemonSet: it stays unless it is gone, has a
// deletion timestamp or no longer targets the pod's node (the pod's spec.nodeName, else
// nodeName). Only the node read may fail without an uninstall: see targetsNode.
func daemonSetStays(ctx context.Context, client *kubeclient.Client, ns, podName, nodeName string) (bool, string) {
	pod, err := client.Pods(ns).Get(ctx, podName, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Sprintf("get pod %s/%s: %v", ns, podName, err)
	}
	owner := metav1.GetControllerOf(pod)
	if owner == nil || owner.Kind != "DaemonSet" {
		return false, fmt.Sprintf("pod %s/%s is not controlled by a DaemonSet", ns, podName)
	}
	ds, err := client.DaemonSets(ns).Get(ctx, owner.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return false, fmt.Sprintf("DaemonSet %s/%s is gone: uninstall", ns, owner.Name)
	case err != nil:
		return false, fmt.Sprintf("get DaemonSet %s/%s: %v", ns, owner.Name, err)
	case ds.UID != owner.UID:
		return false, fmt.Sprintf("DaemonSet %s/%s was replaced by another: uninstall", ns, owner.Name)
	case ds.DeletionTimestamp != nil:
		return false, fmt.Sprintf("DaemonSet %s/%s is being deleted: uninstall", ns, owner.Name)
	}
	nodeName = cmp.Or(pod.Spec.NodeName, nodeName)
	if nodeName == "" {
		return true, fmt.Sprintf("DaemonSet %s/%s stays; the pod names no node, so whether it still targets this one is unknown: kept, as for an upgrade", ns, owner.Name)
	}
	node, err := client.Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		// Kept: an upgrade is by far the commonest SIGTERM. If this was in fact a relabel, the
		// plugin's STATUS turns the node NotReady once its token has been refused long enough
		// (kubernetes.status-unauthorized-after), so the node is not wedged silently.
		return true, fmt.Sprintf("DaemonSet %s/%s stays, but get node %s failed (%v): kept, as for an upgrade", ns, owner.Name, nodeName, err)
	}
	if ok, reason := targetsNode(ds, node); !ok {
		return false, fmt.Sprintf("DaemonSet %s/%s no longer targets node %s (%s): uninstall", ns, owner.Name, nodeName, reason)
	}
	return true, fmt.Sprintf("DaemonSet %s/%s stays and still targets node %s (an upgrade, a restart or a deleted pod): its next pod on this node takes over", ns, owner.Name, nodeName)
}

// targetsNode tells whether the DaemonSet controller would run a pod of ds on node, as its
// NodeShouldRunDaemonPod does (with Kubernetes' own scheduling helpers): the template's
// nodeSelector and required node affinity match, and every NoSchedule or NoExecute taint is
// tolerated by the template's tolerations plus those the controller adds to every daemon pod.
func targetsNode(ds *appsv1.DaemonSet, node *corev1.Node) (bool, string) {
	spec := ds.Spec.Template.Spec
	match, err := nodeaffinity.NewRequiredNodeAffinity(spec.NodeSelector, spec.Affinity).Match(node)
	if err != nil {
		return false, fmt.Sprintf("its node affinity does not parse: %v", err)
	}
	if !match {
		return false, "its nodeSelector or required node affinity does not match the node (labels, name)"
	}
	tolerations := append(append([]corev1.Toleration(nil), spec.Tolerations...), daemonPodTolerations(spec.HostNetwork)...)
	taint, untolerated := corev1helpers.FindMatchingUntoleratedTaint(klog.Background(), node.Spec.Taints, tolerations,
		func(t *corev1.Taint) bool {
			return t.Effect == corev1.TaintEffectNoSchedule || t.Effect == corev1.TaintEffectNoExecute
		}, true)
	if untolerated {
		return false, fmt.Sprintf("it does not tolerate the node's taint %s", taint.ToString())
	}
	return true, ""
}

// daemonPodTolerations are those the DaemonSet controller adds to every pod
// (AddOrUpdateDaemonPodTolerations), so a cordoned node or one under pressure is still targeted;
// and the not-ready and unreachable taints of any effect: the node's lifecycle puts these on while
// a node is down or starting, and an installer stopped meanwhile (a shutdown) must not uninstall.
func daemonPodTolerations(hostNetwork bool) []corev1.Toleration {
	t := []corev1.Toleration{
		{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists},
		{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists},
		{Key: corev1.TaintNodeDiskPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeMemoryPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodePIDPressure, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
		{Key: corev1.TaintNodeUnschedulable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
	}
	if hostNetwork {
		t = append(t, corev1.Toleration{Key: corev1.TaintNodeNetworkUnavailable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
	}
	return t
}
