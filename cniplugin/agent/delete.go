package agent

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// deleteFailed deletes a pod whose validator failed, unless this agent deleted that UID before
// (delete mode: Linkerd's repair controller). A returned error is retried with back-off.
func (a *Agent) deleteFailed(ctx context.Context, pod *corev1.Pod, f Failure) error {
	note := fmt.Sprintf("Deleted pod on node %s: %s, so the redirect to the proxy was not in place; its owner recreates it with the linkerd-cni plugin configured", a.opts.NodeName, f)
	return a.deletePod(ctx, pod, f.ID(), "deleted pod whose network validator failed, so it is recreated with the CNI plugin in place", f.String(), EventReason, note)
}

// deleteDrifted deletes a pod whose rules differ (delete mode), if something recreates it.
func (a *Agent) deleteDrifted(ctx context.Context, pod *corev1.Pod, problem string) {
	if metav1.GetControllerOf(pod) == nil { // nothing would recreate it
		a.log.Warn("rules are missing or different; not deleting a pod that nothing would recreate", "pod", pod.Namespace+"/"+pod.Name, "problem", problem)
		a.events.record(ctx, pod, corev1.EventTypeWarning, ReasonDrift, ActionReport,
			fmt.Sprintf("The linkerd-cni agent on node %s found the redirect rules missing or different; the pod has no owner to recreate it, so it is not deleted (mode delete): %s", a.opts.NodeName, problem), true)
		return
	}
	note := fmt.Sprintf("Deleted pod on node %s: its redirect rules were missing or different, so its owner recreates it with the rules (mode delete): %s", a.opts.NodeName, problem)
	if err := a.deletePod(ctx, pod, "drift", "deleted pod whose rules differ, so it is recreated with them", problem, ReasonDrift, note); err != nil {
		a.log.Warn("delete failed; retried at the next audit", "pod", pod.Namespace+"/"+pod.Name, "error", err.Error())
	}
}

func (a *Agent) deletePod(ctx context.Context, pod *corev1.Pod, why, logMsg, detail, reason, note string) error {
	key := pod.Namespace + "/" + pod.Name
	a.mu.Lock()
	prev, done := a.deleted[pod.UID]
	a.mu.Unlock()
	log := a.log.With("pod", key, "uid", string(pod.UID))
	if done {
		log.Debug("already deleted; not deleting again", "for", prev)
		return nil
	}
	opts := metav1.NewDeleteOptions(0)
	// Only this incarnation: a pod recreated under the same name has its own status.
	opts.Preconditions = metav1.NewUIDPreconditions(string(pod.UID))
	err := a.client.Pods(pod.Namespace).Delete(ctx, pod.Name, *opts)
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		log.Info("pod already gone or replaced; nothing to delete", "reason", string(apierrors.ReasonForError(err)))
		return nil
	case err != nil:
		a.metrics.deleteErrors.Inc()
		return fmt.Errorf("delete pod %s: %w", key, err)
	}
	a.mu.Lock()
	a.deleted[pod.UID] = why
	a.mu.Unlock()
	a.metrics.deleted.Inc()
	log.Info(logMsg, "detail", detail)
	// The deletion happened; an Event failure must not cause a second one.
	a.events.record(ctx, pod, corev1.EventTypeWarning, reason, EventAction, note, false)
	return nil
}
