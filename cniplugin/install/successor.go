package install

import (
	"context"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
)

// successorTimeout bounds the API requests that decide, at SIGTERM, between an upgrade and an
// uninstall: the grace period must still cover the removal.
const successorTimeout = 5 * time.Second

// successorComing tells, at SIGTERM, whether another installer pod will take over this node:
// the pod (Config.PodName) belongs to a DaemonSet that still exists and is not being deleted,
// as in a rolling upgrade, a `rollout restart` or a deleted pod. The plugin, its kubeconfig and
// its entries then stay where they are, so no pod on the node starts unmeshed in between; the
// old pod's token dies with it, so ADDs fail closed (and the kubelet retries them) until the
// next installer rewrites the kubeconfig. In every other case, an API error included, the
// answer is no and the installer removes everything, as it always did. why says which.
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
	return daemonSetStays(ctx, client, in.cfg.Namespace, in.cfg.PodName)
}

// daemonSetStays looks up the pod's controlling DaemonSet: it stays unless it is gone or has a
// deletion timestamp.
func daemonSetStays(ctx context.Context, client *kubeclient.Client, ns, podName string) (bool, string) {
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
	return true, fmt.Sprintf("DaemonSet %s/%s stays (an upgrade, a restart or a deleted pod): its next pod on this node takes over", ns, owner.Name)
}
