package agent

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
)

// maxNote is the API server's limit on an Event's note.
const maxNote = 1024

// eventRecorder records events.k8s.io/v1 Events on pods. A note marked once is recorded once per
// pod UID (a drift left in place, an invalid annotation): the audit finds it again every period.
type eventRecorder struct {
	client     *kubeclient.Client
	controller string
	instance   string
	metrics    *metrics
	log        *slog.Logger

	mu   sync.Mutex
	seen map[types.UID]map[string]bool
}

// record records an Event; false when once is set and the pod had it already.
func (r *eventRecorder) record(ctx context.Context, pod *corev1.Pod, typ, reason, action, note string, once bool) bool {
	if once {
		r.mu.Lock()
		key := reason + "\x00" + note
		if r.seen[pod.UID][key] {
			r.mu.Unlock()
			return false
		}
		if r.seen[pod.UID] == nil {
			r.seen[pod.UID] = map[string]bool{}
		}
		r.seen[pod.UID][key] = true
		r.mu.Unlock()
	}
	if len(note) > maxNote {
		// ToValidUTF8 drops what the cut leaves of a rune.
		note = strings.ToValidUTF8(note[:maxNote-len(" ...")], "") + " ..."
	}
	now := time.Now()
	name := pod.Name[:min(len(pod.Name), 200)]
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name + "." + strconv.FormatInt(now.UnixNano(), 16),
			Namespace: pod.Namespace,
		},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: r.controller,
		ReportingInstance:   r.instance,
		Action:              action,
		Reason:              reason,
		Type:                typ,
		Regarding: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name,
			UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		},
		Note: note,
	}
	if _, err := r.client.Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		r.metrics.eventErrors.Inc()
		r.log.Warn("could not record the event", "pod", pod.Namespace+"/"+pod.Name, "reason", reason, "error", err.Error())
	}
	return true
}

func (r *eventRecorder) forget(uid types.UID) {
	r.mu.Lock()
	delete(r.seen, uid)
	r.mu.Unlock()
}
