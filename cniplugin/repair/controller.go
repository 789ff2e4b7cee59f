package repair

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Event fields of the Event recorded for each deleted pod.
const (
	EventReportingController = "linkerd.io/cni-repair-controller"
	EventReason              = "NetworkValidatorFailed"
	EventAction              = "DeletePod"
)

// Options configure a Controller.
type Options struct {
	// NodeName is the node whose pods are watched (required).
	NodeName string
	// PodName, when set, is the Events' reporting instance (as in Linkerd); else the controller
	// name and the node's.
	PodName string
	// Log receives the controller's logs; nil discards them.
	Log *slog.Logger
	// ResyncPeriod re-examines every watched pod periodically; 0 disables resync (the watch
	// alone delivers every status change).
	ResyncPeriod time.Duration
}

// podKey is the work item: a pod by namespace and name. The UID is checked when the item is
// processed, so a pod recreated under the same name is judged on its own status.
type podKey struct{ namespace, name string }

func (k podKey) String() string { return k.namespace + "/" + k.name }

// Controller deletes the pods on one node whose validator failed. Create it with New, serve its
// Handler, then Run it.
type Controller struct {
	client   kubernetes.Interface
	node     string
	instance string // the Events' reporting instance
	log      *slog.Logger
	factory  informers.SharedInformerFactory
	informer cache.SharedIndexInformer
	lister   listersv1.PodLister
	queue    workqueue.TypedRateLimitingInterface[podKey]
	metrics  *metrics

	running atomic.Bool
	synced  atomic.Bool

	mu sync.Mutex
	// deleted holds the UIDs this controller deleted, with the failure it deleted them for. A
	// UID in it is never deleted again. Entries go when the informer reports the pod gone.
	deleted map[types.UID]string
}

// New returns a controller for opts.NodeName using client. It starts nothing.
func New(client kubernetes.Interface, opts Options) (*Controller, error) {
	if opts.NodeName == "" {
		return nil, fmt.Errorf("node name is empty: set %s", EnvNodeName)
	}
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Controller{
		client:   client,
		node:     opts.NodeName,
		instance: cmp.Or(opts.PodName, EventReportingController+"-"+opts.NodeName),
		log:      log.With("node", opts.NodeName),
		deleted:  map[types.UID]string{},
	}
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[podKey](),
		workqueue.TypedRateLimitingQueueConfig[podKey]{Name: "linkerd-cni-repair"})
	c.metrics = newMetrics(func() float64 { return float64(c.queue.Len()) })

	c.factory = informers.NewSharedInformerFactoryWithOptions(client, opts.ResyncPeriod,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", opts.NodeName).String()
			o.LabelSelector = ControlPlaneNSLabel
		}))
	pods := c.factory.Core().V1().Pods()
	c.informer, c.lister = pods.Informer(), pods.Lister()
	if _, err := c.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.enqueue,
		UpdateFunc: func(_, obj any) { c.enqueue(obj) },
		DeleteFunc: c.forget,
	}); err != nil {
		return nil, fmt.Errorf("watch pods: %w", err)
	}
	return c, nil
}

// enqueue queues a pod only when its validator failed: healthy pods cost no work item.
func (c *Controller) enqueue(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.DeletionTimestamp != nil {
		return
	}
	if _, failed := DetectFailure(pod); failed {
		c.queue.Add(podKey{pod.Namespace, pod.Name})
	}
}

func (c *Controller) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		c.mu.Lock()
		delete(c.deleted, pod.UID)
		c.mu.Unlock()
	}
}

// Run starts the watch, waits for its first list, then processes the queue until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.running.Store(true)
	defer c.running.Store(false)
	defer c.queue.ShutDown()
	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	c.log.Info("repair controller starting", "label_selector", ControlPlaneNSLabel)
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return fmt.Errorf("watch pods on node %s: %w", c.node, context.Cause(ctx))
	}
	c.synced.Store(true)
	c.log.Info("repair controller ready")
	go func() {
		<-ctx.Done()
		c.queue.ShutDown()
	}()
	// One worker: the cluster sends at most a node's worth of pods, and a single worker makes
	// "never delete a pod twice" trivially true.
	for c.processNext(ctx) {
	}
	return nil
}

// Ready reports whether the watch has synced and the worker is running.
func (c *Controller) Ready() bool { return c.running.Load() && c.synced.Load() }

func (c *Controller) processNext(ctx context.Context) bool {
	key, shutdown := c.queue.Get()
	if shutdown {
		return false
	}
	defer c.queue.Done(key)
	if err := c.repair(ctx, key); err != nil {
		c.metrics.deleteErrors.Inc()
		c.log.Warn("delete failed; retrying with back-off", "pod", key.String(), "error", err.Error(),
			"retries", c.queue.NumRequeues(key))
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

// repair deletes the pod behind key if, as the cache sees it now, its validator failed and this
// controller has not deleted that UID before. A returned error is retried with back-off.
func (c *Controller) repair(ctx context.Context, key podKey) error {
	pod, err := c.lister.Pods(key.namespace).Get(key.name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read pod from cache: %w", err)
	}
	if pod.DeletionTimestamp != nil {
		return nil
	}
	f, failed := DetectFailure(pod)
	if !failed {
		return nil
	}
	c.mu.Lock()
	prev, done := c.deleted[pod.UID]
	c.mu.Unlock()
	log := c.log.With("pod", key.String(), "uid", string(pod.UID))
	if done {
		log.Debug("already deleted for a failure; not deleting again", "failure", prev)
		return nil
	}

	zero := int64(0)
	uid := pod.UID
	err = c.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: &zero,
		// Only this incarnation: a pod recreated under the same name has its own status.
		Preconditions: &metav1.Preconditions{UID: &uid},
	})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		log.Info("pod already gone or replaced; nothing to delete", "reason", string(apierrors.ReasonForError(err)))
		return nil
	case err != nil:
		return fmt.Errorf("delete pod %s: %w", key, err)
	}
	c.mu.Lock()
	c.deleted[uid] = f.ID()
	c.mu.Unlock()
	c.metrics.deleted.Inc()
	log.Info("deleted pod whose network validator failed, so it is recreated with the CNI plugin in place", "failure", f.String())
	if err := c.recordEvent(ctx, pod, f); err != nil {
		// The deletion happened; an event failure must not cause a second one.
		c.metrics.eventErrors.Inc()
		log.Warn("could not record the event", "error", err.Error())
	}
	return nil
}

func (c *Controller) recordEvent(ctx context.Context, pod *corev1.Pod, f Failure) error {
	now := time.Now()
	name := pod.Name
	if len(name) > 200 {
		name = name[:200]
	}
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name + "." + strconv.FormatInt(now.UnixNano(), 16),
			Namespace: pod.Namespace,
		},
		EventTime:           metav1.NewMicroTime(now),
		ReportingController: EventReportingController,
		ReportingInstance:   c.instance,
		Action:              EventAction,
		Reason:              EventReason,
		Type:                corev1.EventTypeWarning,
		Regarding: corev1.ObjectReference{
			Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name,
			UID: pod.UID, ResourceVersion: pod.ResourceVersion,
		},
		Note: fmt.Sprintf("Deleted pod on node %s: %s, so the redirect to the proxy was not in place; its owner recreates it with the linkerd-cni plugin configured",
			c.node, f),
	}
	if _, err := c.client.EventsV1().Events(pod.Namespace).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create event: %w", err)
	}
	return nil
}

// errNotRunning is reported by /live before Run starts and after it returns.
var errNotRunning = errors.New("controller not running")
