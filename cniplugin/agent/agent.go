package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	listersv1 "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/cniplugin/wire"
	"github.com/kubemesh/proxy-init/iptables/runner"
)

// Mode is what the agent does about a meshed pod whose rules are missing or differ.
type Mode string

const (
	// ModeRepair rewrites the rules in place (the default).
	ModeRepair Mode = "repair"
	// ModeDelete deletes the pod so that its owner recreates it with the plugin in place; it is
	// also Linkerd's repair controller (pods whose validator failed are deleted).
	ModeDelete Mode = "delete"
	// ModeReport records Events and metrics only.
	ModeReport Mode = "report"
)

// Modes lists the modes, for flags and messages.
var Modes = []Mode{ModeRepair, ModeDelete, ModeReport}

// Event fields. The agent and the repair controller each report as their own controller.
const (
	EventReportingController = "linkerd.io/cni-repair-controller"
	AgentReportingController = "linkerd.io/cni-agent"

	// EventReason and EventAction are the deletion of a pod whose validator failed (Linkerd's).
	EventReason = "NetworkValidatorFailed"
	EventAction = "DeletePod"

	// What the audit found, and did.
	ReasonRepaired     = "RedirectRepaired"
	ReasonRepairFailed = "RedirectRepairFailed"
	ReasonDrift        = "RedirectDrift"
	ReasonInvalid      = "InvalidAnnotation"
	ReasonEdited       = "AnnotationsChangedAfterStart"
	ReasonLockBusy     = "NamespaceLockBusy"
	ActionRewrite      = "RewriteRules"
	ActionReport       = "Report"
	ActionLeaveRules   = "LeaveRules"
)

const defaultLookupWait = time.Second

// workers is how many pods the agent audits (or deletes) at once. The queue never hands one pod
// to two of them, so no pod is audited or deleted twice at the same time; a pod whose audit is
// slow (its lock held: at most cniplugin.AuditLockWait) takes one worker, not the node's audits.
const workers = 4

// Options configure an Agent. Only NodeName is required; each part is off unless configured.
type Options struct {
	// NodeName is the node whose pods are watched.
	NodeName string
	// PodName is the Events' reporting instance; empty: the controller name and the node's.
	PodName string
	// Mode says what to do about drift and failed validators; empty is ModeRepair.
	Mode Mode
	// Socket, when set, is the UNIX socket the plugin asks; its directory is made root-only.
	Socket string
	// KubeletPodsSocket, when set with Socket, is the kubelet's pods API socket, read for the
	// lookups the watch cannot answer (not synced yet, or a pod not delivered yet).
	KubeletPodsSocket string
	// HostProc is the node's /proc, where the socket's peers are checked (wire.CheckPeer); empty
	// is this process's /proc, for an agent in the node's PID namespace.
	HostProc string
	// InstallerReadyURL, when set, is the installer's /ready, polled for installer_ready.
	InstallerReadyURL string
	// LookupWait bounds how long a lookup waits for a pod (or namespace) the watch has not
	// delivered yet; 0 means one second.
	LookupWait time.Duration
	// AuditPeriod, when positive, audits every meshed pod of the node that often, besides on
	// pod events. Audits need Sandboxes and NetConf.
	AuditPeriod time.Duration
	// Sandboxes finds a pod's network namespace (the CRI in production).
	Sandboxes SandboxFinder
	// NetConf is the node's linkerd-cni network config; nil (or not found): nothing is audited.
	NetConf *NetConfSource
	// NetNSDir is the node's /var/run/netns as the agent sees it, where a write request's
	// CNI_NETNS must be pinned (write.go); empty: the agent writes no plugin's ADD.
	NetNSDir string
	// OwnNetNS and HostNetNS are the agent's own network namespace and the node's, which a write
	// never goes to; empty are /proc/self/ns/net and HostProc's 1/ns/net (tests pass stand-ins).
	OwnNetNS, HostNetNS string
	// Runner writes and reads the rules; the zero Runner is the real one.
	Runner runner.Runner
	// MetricsPrefix and ReportingController name the metrics and the Events' controller (empty: the agent's).
	MetricsPrefix, ReportingController string
	// Log receives the agent's logs; nil discards them. PluginLog receives the plugin calls'
	// lines verbatim (nil: not printed).
	Log       *slog.Logger
	PluginLog io.Writer
	// ResyncPeriod re-delivers every watched pod periodically; 0 disables it.
	ResyncPeriod time.Duration
}

// Agent is the node agent. Create it with New, serve its Handler, then Run it.
type Agent struct {
	opts    Options
	client  *kubeclient.Client
	log     *slog.Logger
	metrics *metrics
	events  *eventRecorder

	podInf cache.SharedIndexInformer
	pods   listersv1.PodLister
	// nsInf and svcInf exist when lookups or audits do (nil for Linkerd's repair controller).
	nsInf, svcInf cache.SharedIndexInformer
	namespaces    listersv1.NamespaceLister
	services      listersv1.ServiceLister
	arrived       *notifier // pods and namespaces the watch delivers
	// kubelet reads pods from the kubelet's pods API (nil without KubeletPodsSocket).
	kubelet *kubeletPods

	queue workqueue.TypedRateLimitingInterface[cache.ObjectName]

	running, synced atomic.Bool
	// notLive is what /live answered last: its changes are logged.
	notLive atomic.Bool

	mu sync.Mutex
	// deleted holds the UIDs this agent deleted, with why. A UID in it is never deleted again.
	deleted map[types.UID]string
	// gone holds the sandboxes the plugin's DEL went through: their rules are not audited.
	gone map[string]time.Time
	// unrecorded holds the pods said once to have no record of their sandbox's settings.
	unrecorded map[types.UID]bool
	// unauditable says once that the node's mode needs binaries this image lacks.
	unauditable sync.Once
	// writeOff says why the agent writes no plugin's ADD (route 1); nil when it does.
	writeOff *wire.Error
}

// New returns an agent for opts.NodeName using client. It starts nothing.
func New(client *kubeclient.Client, opts Options) (*Agent, error) {
	if opts.NodeName == "" {
		return nil, errors.New("node name is empty: set --node-name")
	}
	opts.Mode = cmp.Or(opts.Mode, ModeRepair)
	opts.LookupWait = cmp.Or(opts.LookupWait, defaultLookupWait)
	opts.HostProc = cmp.Or(opts.HostProc, "/proc")
	opts.OwnNetNS = cmp.Or(opts.OwnNetNS, "/proc/self/ns/net")
	opts.HostNetNS = cmp.Or(opts.HostNetNS, opts.HostProc+"/1/ns/net")
	if opts.AuditPeriod > 0 && (opts.Sandboxes == nil || opts.NetConf == nil) {
		return nil, errors.New("audits need a sandbox finder and the node's network config")
	}
	controller := cmp.Or(opts.ReportingController, AgentReportingController)
	a := &Agent{
		opts:       opts,
		client:     client,
		log:        cmp.Or(opts.Log, slog.New(slog.DiscardHandler)).With("node", opts.NodeName),
		arrived:    &notifier{ch: make(chan struct{})},
		deleted:    map[types.UID]string{},
		gone:       map[string]time.Time{},
		unrecorded: map[types.UID]bool{},
	}
	if a.lookups() {
		a.writeOff = a.whyNoWrites()
	}
	a.queue = workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[cache.ObjectName](),
		workqueue.TypedRateLimitingQueueConfig[cache.ObjectName]{Name: "linkerd-cni-agent"})
	a.metrics = newMetrics(cmp.Or(opts.MetricsPrefix, MetricsPrefix), func() float64 { return float64(a.queue.Len()) }, opts.InstallerReadyURL != "")
	a.events = &eventRecorder{client: client, controller: controller, metrics: a.metrics, log: a.log,
		instance: cmp.Or(opts.PodName, controller+"-"+opts.NodeName), seen: map[types.UID]map[string]bool{}}

	// Linkerd's repair controller watches only meshed pods (they carry this label); the agent
	// also needs every pod of the node for lookups.
	label := ""
	if !a.lookups() && opts.AuditPeriod <= 0 {
		label = ControlPlaneNSLabel
	}
	a.podInf = client.Pods(metav1.NamespaceAll).Informer(opts.ResyncPeriod, func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", opts.NodeName).String()
		o.LabelSelector = label
	})
	a.pods = listersv1.NewPodLister(a.podInf.GetIndexer())
	if _, err := a.podInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { a.arrived.notify(); a.podChanged(nil, obj) },
		UpdateFunc: func(old, obj any) { a.arrived.notify(); a.podChanged(old, obj) },
		DeleteFunc: a.forget,
	}); err != nil {
		return nil, fmt.Errorf("watch pods: %w", err)
	}
	if a.lookups() || opts.AuditPeriod > 0 {
		a.nsInf = client.Namespaces().Informer(0, nil)
		a.namespaces = listersv1.NewNamespaceLister(a.nsInf.GetIndexer())
		if _, err := a.nsInf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { a.arrived.notify() },
			UpdateFunc: a.namespaceChanged,
		}); err != nil {
			return nil, fmt.Errorf("watch namespaces: %w", err)
		}
		// One object: the ports control-plane pods skip.
		a.svcInf = client.Services("default").Informer(0, func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", "kubernetes").String()
		})
		a.services = listersv1.NewServiceLister(a.svcInf.GetIndexer())
	}
	if a.lookups() && opts.KubeletPodsSocket != "" {
		k, err := newKubeletPods(opts.KubeletPodsSocket)
		if err != nil {
			return nil, err
		}
		a.kubelet = k
	}
	return a, nil
}

func (a *Agent) lookups() bool { return a.opts.Socket != "" }
func (a *Agent) audits() bool  { return a.opts.AuditPeriod > 0 }

// podChanged queues a pod for the worker when there is something to do: a failed validator in
// delete mode (healthy pods cost no work item, as in Linkerd's controller), or, with audits, a
// meshed pod that is new or whose annotations, phase or validator changed.
func (a *Agent) podChanged(old, obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok || pod.DeletionTimestamp != nil {
		return
	}
	key := cache.MetaObjectToName(pod)
	if _, failed := DetectFailure(pod); failed && (a.opts.Mode == ModeDelete || a.audits()) {
		a.queue.Add(key)
		return
	}
	if !a.audits() || !meshedSpec(pod) {
		return
	}
	if prev, ok := old.(*corev1.Pod); ok && prev.Status.Phase == pod.Status.Phase &&
		maps.Equal(prev.Annotations, pod.Annotations) && sandboxReady(prev) == sandboxReady(pod) {
		return
	}
	a.queue.Add(key)
}

// namespaceChanged audits the namespace's meshed pods when its annotations change: they may
// inherit them.
func (a *Agent) namespaceChanged(old, obj any) {
	prev, ok1 := old.(*corev1.Namespace)
	ns, ok2 := obj.(*corev1.Namespace)
	if a.audits() && ok1 && ok2 && !maps.Equal(prev.Annotations, ns.Annotations) {
		a.queueMeshed(ns.Name)
	}
}

func (a *Agent) forget(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		a.mu.Lock()
		delete(a.deleted, pod.UID)
		delete(a.unrecorded, pod.UID)
		a.mu.Unlock()
		a.events.forget(pod.UID)
		if a.opts.Sandboxes != nil {
			a.opts.Sandboxes.Forget(string(pod.UID), "")
		}
	}
}

// Run starts the watches, waits for their first list, then serves the socket, audits and
// processes the queue until ctx ends.
func (a *Agent) Run(ctx context.Context) error {
	a.running.Store(true)
	defer a.running.Store(false)
	defer a.queue.ShutDown()
	// The watches stop, and are waited for, whenever Run returns.
	ctx, cancel := context.WithCancel(ctx)
	var watches sync.WaitGroup
	defer watches.Wait()
	defer cancel()
	informers := []cache.SharedIndexInformer{a.podInf}
	if a.nsInf != nil {
		informers = append(informers, a.nsInf, a.svcInf)
	}
	var synced []cache.InformerSynced
	for _, inf := range informers {
		watches.Go(func() { inf.RunWithContext(ctx) })
		synced = append(synced, inf.HasSynced)
	}
	a.log.Info("agent starting", "mode", string(a.opts.Mode), "socket", a.opts.Socket, "kubelet_pods_socket", a.opts.KubeletPodsSocket, "audit_period", a.opts.AuditPeriod.String())
	if a.kubelet != nil {
		defer a.kubelet.Close()
	}

	if u := a.opts.InstallerReadyURL; u != "" {
		go a.watchInstaller(ctx, u)
	}
	var srv *server
	if a.lookups() {
		var err error
		if srv, err = a.listen(); err != nil {
			return err
		}
		defer srv.close()
		if a.writeOff != nil {
			a.log.Info("the agent does not write the plugin's ADDs (route 1); the plugin writes them with the agent's lookups", "why", a.writeOff.Message)
		} else {
			a.log.Info("the agent writes the plugin's ADDs (route 1)", "netns_dir", a.opts.NetNSDir)
		}
		go srv.serve(ctx)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("watch pods on node %s: %w", a.opts.NodeName, context.Cause(ctx))
	}
	a.synced.Store(true)
	a.log.Info("agent ready")
	context.AfterFunc(ctx, a.queue.ShutDown)
	if a.audits() {
		go a.auditWhenChained(ctx)
		go a.auditEvery(ctx, a.opts.AuditPeriod)
	}
	var busy sync.WaitGroup
	for range workers {
		busy.Go(func() {
			for a.processNext(ctx) {
			}
		})
	}
	busy.Wait()
	return nil
}

// Ready reports whether the watches have synced and the worker is running.
func (a *Agent) Ready() bool { return a.running.Load() && a.synced.Load() }

func (a *Agent) processNext(ctx context.Context) bool {
	key, shutdown := a.queue.Get()
	if shutdown {
		return false
	}
	defer a.queue.Done(key)
	if err := a.process(ctx, key); err != nil {
		a.log.Warn("retrying with back-off", "pod", key.String(), "error", err.Error(), "retries", a.queue.NumRequeues(key))
		a.queue.AddRateLimited(key)
	} else {
		a.queue.Forget(key)
	}
	return true
}

// process handles one pod, by name, as the cache sees it now (whatever its UID): a failed
// validator in delete mode is a deletion; otherwise, with audits, an audit.
func (a *Agent) process(ctx context.Context, key cache.ObjectName) error {
	pod, err := a.pods.Pods(key.Namespace).Get(key.Name)
	if err != nil || pod.DeletionTimestamp != nil {
		return nil //nolint:nilerr // gone, or going: nothing to do
	}
	if f, failed := DetectFailure(pod); failed && a.opts.Mode == ModeDelete {
		return a.deleteFailed(ctx, pod, f)
	}
	if a.audits() {
		a.audit(ctx, pod)
	}
	return nil
}

// sandboxGone records that the plugin's DEL went through sandbox id, so an audit never "heals"
// rules the DEL removed while the sandbox is being torn down, and lets its namespace go.
func (a *Agent) sandboxGone(id string) {
	if id == "" {
		return
	}
	if a.opts.Sandboxes != nil {
		a.opts.Sandboxes.Forget("", id)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	a.gone[id] = now
	for k, t := range a.gone {
		if now.Sub(t) > 10*time.Minute {
			delete(a.gone, k)
		}
	}
}

// notifier wakes lookups waiting for the watch to deliver something.
type notifier struct {
	mu sync.Mutex
	ch chan struct{}
}

func (n *notifier) notify() {
	n.mu.Lock()
	close(n.ch)
	n.ch = make(chan struct{})
	n.mu.Unlock()
}

// wait calls found until it returns true, after each delivery, until ctx ends.
func (n *notifier) wait(ctx context.Context, found func() bool) bool {
	for {
		n.mu.Lock()
		ch := n.ch
		n.mu.Unlock()
		if found() {
			return true
		}
		select {
		case <-ctx.Done():
			return found()
		case <-ch:
		}
	}
}
