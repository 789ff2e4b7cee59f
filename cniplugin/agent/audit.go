package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
)

// auditWhenChained waits until the node's CNI config chains linkerd-cni (the installer, starting
// beside the agent, has put it there), then queues every meshed pod once: the audits of the
// initial list found no config to audit against.
func (a *Agent) auditWhenChained(ctx context.Context) {
	tick(ctx, time.Second, false, func() bool {
		_, err := a.opts.NetConf.Load()
		if err == nil {
			a.metrics.chained.Set(1)
			a.queueMeshed("")
		}
		return err != nil
	})
}

// auditEvery queues every meshed pod of the node each period, until ctx ends.
func (a *Agent) auditEvery(ctx context.Context, period time.Duration) {
	tick(ctx, period, true, func() bool {
		a.queueMeshed("")
		a.sweep()
		return true
	})
}

// tick calls fn every period, and at once unless wait, until ctx ends or fn returns false.
func tick(ctx context.Context, period time.Duration, wait bool, fn func() bool) {
	t := time.NewTicker(period)
	defer t.Stop()
	for wait || fn() {
		wait = false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweepGrace is the age under which a record is never swept: ADD writes it once its pod exists,
// but the agent's watch may deliver that pod a moment later.
const sweepGrace = 5 * time.Minute

// sweep removes what the plugin leaves on the node for sandboxes gone without a DEL: lock files
// nobody holds (runner.SweepHostLocks says why that is always safe), and the records of pods no
// longer on the node.
func (a *Agent) sweep() {
	conf, err := a.opts.NetConf.Load()
	if err != nil {
		return
	}
	locks, err := runner.SweepHostLocks(filepath.Join(conf.StateDir, cniplugin.LocksDir))
	if err != nil {
		a.log.Warn("could not sweep the namespaces' lock files", "error", err.Error())
	}
	records, err := cniplugin.SweepRecords(filepath.Join(conf.StateDir, cniplugin.RecordsDir), sweepGrace, a.onNode)
	if err != nil {
		a.log.Warn("could not sweep the records of the pods' settings", "error", err.Error())
	}
	a.log.Debug("swept", "lock_files", locks, "records", records)
}

// onNode tells whether the pod named namespace/name, with uid when given, is one of the node's.
func (a *Agent) onNode(pod, uid string) bool {
	ns, name, _ := strings.Cut(pod, "/")
	p, err := a.pods.Pods(ns).Get(name)
	return err == nil && (uid == "" || string(p.UID) == uid)
}

// queueMeshed queues the meshed pods of namespace ("": every namespace).
func (a *Agent) queueMeshed(namespace string) {
	for _, p := range a.meshedPods(namespace) {
		a.queue.Add(cache.MetaObjectToName(p))
	}
}

// meshedPods lists the meshed pods of namespace ("": every namespace) not being deleted.
func (a *Agent) meshedPods(namespace string) []*corev1.Pod {
	pods, _ := a.pods.Pods(namespace).List(everything) // a new slice: the lister appends to it
	return slices.DeleteFunc(pods, func(p *corev1.Pod) bool {
		return !meshedSpec(p) || p.DeletionTimestamp != nil
	})
}

// Pass is what one AuditAll did.
type Pass struct {
	// Audited counts the pods whose rules were looked at; Busy those whose namespace lock was busy.
	Audited, Busy int
	// Took is the whole pass; LastAudited is when the last pod counted in Audited was done.
	Took, LastAudited time.Duration
}

// AuditAll audits every meshed pod of the node once, with as many goroutines as the queue has
// workers: one period's pass without the queue (benchmarks, tests).
func (a *Agent) AuditAll(ctx context.Context) Pass {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var p Pass
	pods, start := make(chan *corev1.Pod), time.Now()
	for range workers {
		wg.Go(func() {
			for pod := range pods {
				out := a.audit(ctx, pod)
				mu.Lock()
				switch out {
				case audited:
					p.Audited++
					p.LastAudited = time.Since(start)
				case lockBusy:
					p.Busy++
				}
				mu.Unlock()
			}
		})
	}
	for _, pod := range a.meshedPods("") {
		pods <- pod
	}
	close(pods)
	wg.Wait()
	p.Took = time.Since(start)
	return p
}

// outcome is what became of one pod's audit.
type outcome int

const (
	notAudited outcome = iota // not a pod to audit, or the audit could not run
	audited                   // its rules were looked at
	lockBusy                  // its namespace's lock was not had within cniplugin.AuditLockWait
)

// auditTimeout bounds one pod's audit: the runtime's answer, the namespace lock, the read and
// the rewrite.
const auditTimeout = 30 * time.Second

// audit checks one pod with CHECK's logic and acts by mode.
func (a *Agent) audit(ctx context.Context, pod *corev1.Pod) outcome {
	ctx, cancel := context.WithTimeout(ctx, auditTimeout)
	defer cancel()
	log := a.log.With("pod", pod.Namespace+"/"+pod.Name, "uid", string(pod.UID))
	if !meshedSpec(pod) || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return notAudited
	}
	conf, err := a.opts.NetConf.Load()
	a.metrics.chained.Set(boolGauge(err == nil))
	if err != nil {
		log.Debug("not audited: no linkerd-cni network config on the node", "error", err.Error())
		return notAudited
	}
	if mode := conf.Linkerd.Mode; needsBinaries(mode) && !a.haveBinaries(mode) {
		a.unauditable.Do(func() {
			log.Warn("not auditing: iptables-mode " + string(mode) + " is read with the iptables binaries, which this image does not hold; the plugin still writes the rules at ADD")
		})
		return notAudited
	}
	sb, err := a.opts.Sandboxes.Find(ctx, string(pod.UID))
	switch {
	case errors.Is(err, ErrNoSandbox):
		log.Debug("not audited: no ready sandbox")
		return notAudited
	case errors.Is(err, ErrNoNetNS):
		// The finder said why, once per sandbox.
		a.metrics.auditErrors.Inc()
		log.Debug("not audited: " + err.Error())
		return notAudited
	case err != nil:
		a.metrics.auditErrors.Inc()
		log.Warn("not audited: cannot find the pod's network namespace", "error", err.Error())
		return notAudited
	}
	defer sb.Close()
	a.mu.Lock()
	_, gone := a.gone[sb.ID]
	a.mu.Unlock()
	if gone {
		return notAudited
	}
	log = log.With("sandbox", sb.ID, "netns", sb.Where)
	p := cniplugin.NewStandalone(&cacheAPI{a: a, uid: pod.UID})
	p.Runner = a.opts.Runner
	args := cniplugin.PodArgs{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), InfraContainerID: sb.ID}
	start := time.Now()
	res, err := p.Audit(ctx, conf, args, sb.NetNS, a.opts.Mode == ModeRepair, log)
	a.metrics.auditSeconds.Observe(time.Since(start).Seconds())
	if res.Skipped != "" {
		return notAudited
	}
	a.reportSettings(ctx, pod, res, log)
	var busy *runner.BusyError
	if errors.As(err, &busy) {
		a.reportBusy(ctx, pod, busy, log)
		return lockBusy
	}
	if bad, ok := badinput.As(err); ok {
		a.metrics.auditErrors.Inc()
		note := fmt.Sprintf("The annotations are invalid, so the linkerd-cni agent cannot tell which rules this pod needs; its rules are left as they are: %s", bad.Error())
		log.Warn("not audited: invalid annotation; the rules are left as they are", "error", bad.Error())
		a.events.record(ctx, pod, corev1.EventTypeWarning, ReasonInvalid, ActionLeaveRules, note, true)
		return notAudited
	}
	if err != nil && sb.Where != "" {
		// Messages name the namespace as the runtime did, not by the descriptor entered.
		err = errors.New(strings.ReplaceAll(err.Error(), sb.NetNS, sb.Where))
	}
	a.act(ctx, pod, res, err, log)
	return audited
}

// act counts an audit that looked at the pod's rules, and acts on what it found by mode.
func (a *Agent) act(ctx context.Context, pod *corev1.Pod, res cniplugin.AuditResult, err error, log *slog.Logger) {
	a.metrics.audited.Inc()
	if res.Drifted() {
		a.metrics.drifted.Inc()
	}
	switch {
	case err != nil && res.Drifted():
		// The rewrite failed.
		a.metrics.healErrors.Inc()
		log.Error("the pod's rules differ and could not be rewritten", "problem", res.Problem, "error", err.Error())
		a.events.record(ctx, pod, corev1.EventTypeWarning, ReasonRepairFailed, ActionRewrite,
			fmt.Sprintf("The redirect rules on node %s differ from the expected ones and could not be rewritten: %s. %s", a.opts.NodeName, err, res.Problem), true)
	case err != nil:
		a.metrics.auditErrors.Inc()
		log.Warn("audit failed", "error", err.Error())
	case !res.Drifted():
		log.Debug("rules match", "backend", res.Backend)
	case res.Healed:
		a.metrics.healed.Inc()
		log.Info("rules were missing or different; rewrote them in place", "backend", res.Backend, "problem", res.Problem)
		a.events.record(ctx, pod, corev1.EventTypeWarning, ReasonRepaired, ActionRewrite,
			fmt.Sprintf("The linkerd-cni agent on node %s found the redirect rules missing or different and rewrote them in place with %s (mode repair): %s", a.opts.NodeName, res.Backend, res.Problem), false)
	case a.opts.Mode == ModeDelete:
		a.deleteDrifted(ctx, pod, res.Problem)
	default:
		log.Warn("rules are missing or different (mode report: left as they are)", "problem", res.Problem)
		a.events.record(ctx, pod, corev1.EventTypeWarning, ReasonDrift, ActionReport,
			fmt.Sprintf("The linkerd-cni agent on node %s found the redirect rules missing or different and left them (mode report): %s", a.opts.NodeName, res.Problem), true)
	}
}

// reportSettings reports, once per distinct edit, annotations changed since the pod's sandbox was
// set up (they were not applied), and says once per pod that its sandbox has no record.
func (a *Agent) reportSettings(ctx context.Context, pod *corev1.Pod, res cniplugin.AuditResult, log *slog.Logger) {
	if len(res.Edited) > 0 {
		edits := strings.Join(res.Edited, "; ")
		note := fmt.Sprintf("Changed after the pod's sandbox was set up, so not applied (linkerd-cni reads them at set-up only, as Linkerd does; the rules keep the settings the pod started with, and a new pod gets the new ones): %s", edits)
		if a.events.record(ctx, pod, corev1.EventTypeWarning, ReasonEdited, ActionReport, note, true) {
			a.metrics.edited.Inc()
			log.Warn("annotations changed after the pod's sandbox was set up; not applied", "changed", edits)
		}
	}
	if !res.Unrecorded {
		return
	}
	a.mu.Lock()
	said := a.unrecorded[pod.UID]
	a.unrecorded[pod.UID] = true
	a.mu.Unlock()
	if !said {
		log.Info("no record of the settings the pod's sandbox was set up with (set up before linkerd-cni kept them, or the record was lost): its rules are checked against its current annotations")
	}
}

// reportBusy counts an audit whose namespace lock was not had, and says so once per pod and lock.
func (a *Agent) reportBusy(ctx context.Context, pod *corev1.Pod, busy *runner.BusyError, log *slog.Logger) {
	a.metrics.lockBusy.Inc()
	note := fmt.Sprintf("The linkerd-cni agent on node %s could not take the lock of this pod's network namespace within %s, so it did not audit its redirect rules (it tries again every audit period; the other pods' audits are not delayed). Lock: %s", a.opts.NodeName, busy.Wait, busy.Lock)
	if a.events.record(ctx, pod, corev1.EventTypeWarning, ReasonLockBusy, ActionReport, note, true) {
		log.Warn("not audited: the namespace's lock is held", "lock", busy.Lock, "wait", busy.Wait.String())
		return
	}
	log.Debug("not audited: the namespace's lock is held", "lock", busy.Lock)
}

// meshedSpec tells, from the spec alone, whether the plugin writes rules for the pod; the spec
// is read the way the plugin reads it.
func meshedSpec(pod *corev1.Pod) bool {
	spec := pluginSpec(&pod.Spec)
	return cniplugin.Classify(&spec).NeedsRules()
}

// sandboxReady tells whether the kubelet reports the pod's sandbox ready (it is, once the CNI
// ADD is done).
func sandboxReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReadyToStartContainers {
			return c.Status == corev1.ConditionTrue
		}
	}
	return pod.Status.Phase == corev1.PodRunning
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// haveBinaries tells whether the iptables binaries of mode are on this process's PATH.
func (a *Agent) haveBinaries(mode iptables.Mode) bool {
	name := "iptables-restore"
	if mode == iptables.ModeLegacy {
		name = "iptables-legacy-restore"
	}
	_, err := exec.LookPath(name)
	return err == nil
}
