package repair

import (
	"context"
	"encoding/json"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
)

// RemoveNodeTaint removes every taint with key (whatever its effect) from node and reports
// whether it removed any: nodes born with a startup taint get no meshed pod before linkerd-cni is
// ready, and the installer (--node-taint) calls this once the node's conflist carries the plugin.
// The merge patch carries the resourceVersion read, retried on conflict, so a taint another actor
// adds meanwhile is never lost. An absent taint is not an error. RBAC: nodes get and patch.
func RemoveNodeTaint(ctx context.Context, client *kubeclient.Client, node, key string) (bool, error) {
	if key == "" {
		return false, fmt.Errorf("remove taint from node %s: empty taint key", node)
	}
	removed := false
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		removed = false
		n, err := client.Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		var keep []corev1.Taint
		for _, t := range n.Spec.Taints {
			if t.Key != key {
				keep = append(keep, t)
			}
		}
		if len(keep) == len(n.Spec.Taints) {
			return nil
		}
		// A JSON merge patch replaces the list as a whole; the resourceVersion makes the
		// server refuse it (409, retried) if the node changed since it was read.
		patch := map[string]any{
			"metadata": map[string]any{"resourceVersion": n.ResourceVersion},
			"spec":     map[string]any{"taints": keep}, // nil marshals to null: no taints left
		}
		body, err := json.Marshal(patch)
		if err != nil {
			return err
		}
		if _, err := client.Nodes().Patch(ctx, node, types.MergePatchType, body,
			metav1.PatchOptions{FieldManager: "linkerd-cni"}); err != nil {
			return err
		}
		removed = true
		return nil
	})
	if err != nil {
		return false, fmt.Errorf("remove taint %q from node %s: %w", key, node, err)
	}
	return removed, nil
}
