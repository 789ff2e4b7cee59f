package agent

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/iptables"
)

// auditWhenChained waits until the node's CNI config chains linkerd-cni (the installer, starting
// beside the agent, has put it there), then queues every meshed pod once: the audits of the
// initial list found no config to audit against.
func (a *Agent) auditWhenChained(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		if _, err := a.opts.NetConf.Load(); err == nil {
			a.metrics.chained.Set(1)
			for _, k := range a.meshedPods() {
				a.queue.Add(k)
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// auditEvery queues every meshed pod of the node each period, until ctx ends.
func (a *Agent) auditEvery(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			for _, k := range a.meshedPods() {
				a.queue.Add(k)
			}
		}
	}
}

func (a *Agent) meshedPods() []podKey {
	pods, err := a.pods.List(everything)
	if err != nil {
		return nil
	}
	var keys []podKey
	for _, p := range pods {
		if meshedSpec(p) && p.DeletionTimestamp == nil {
			keys = append(keys, podKey{p.Namespace, p.Name})
		}
	}
	return keys
}

// AuditAll audits every meshed pod of the node once, in this goroutine, and returns how many it
// looked at; it is one period's pass without the queue (benchmarks, tests).
func (a *Agent) AuditAll(ctx context.Context) int {
	n := 0
	for _, k := range a.meshedPods() {
		if pod, err := a.pods.Pods(k.namespace).Get(k.name); err == nil && a.audit(ctx, pod) {
			n++
		}
	}
	return n
}

// auditTimeout bounds one pod's audit: the runtime's answer, the namespace lock, the read and
// the rewrite.
const auditTimeout = 30 * time.Second

// audit checks one pod with CHECK's logic and acts by mode. It reports whether the pod's rules
// were looked at.
func (a *Agent) audit(ctx context.Context, pod *corev1.Pod) bool {
	ctx, cancel := context.WithTimeout(ctx, auditTimeout)
	defer cancel()
	log := a.log.With("pod", pod.Namespace+"/"+pod.Name, "uid", string(pod.UID))
	if !meshedSpec(pod) || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return false
	}
	conf, err := a.opts.NetConf.Load()
	a.metrics.chained.Set(boolGauge(err == nil))
	if err != nil {
		log.Debug("not audited: no linkerd-cni network config on the node", "error", err.Error())
		return false
	}
	if mode := conf.Linkerd.IPTablesMode; needsBinaries(mode) && !a.haveBinaries(mode) {
		a.unauditable.Do(func() {
			log.Warn("not auditing: iptables-mode " + string(mode) + " is read with the iptables binaries, which this image does not hold; the plugin still writes the rules at ADD")
		})
		return false
	}
	sb, err := a.opts.Sandboxes.Find(ctx, string(pod.UID))
	switch {
	case errors.Is(err, ErrNoSandbox):
		log.Debug("not audited: no ready sandbox")
		return false
	case errors.Is(err, ErrNoNetNS):
		// The finder said why, once per sandbox.
		a.metrics.auditErrors.Inc()
		log.Debug("not audited: " + err.Error())
		return false
	case err != nil:
		a.metrics.auditErrors.Inc()
		log.Warn("not audited: cannot find the pod's network namespace", "error", err.Error())
		return false
	}
	defer sb.Close()
	if a.isGone(sb.ID) {
		return false
	}
	log = log.With("sandbox", sb.ID, "netns", sb.Where)
	p := cniplugin.NewStandalone(&cacheAPI{a: a, uid: pod.UID})
	p.Runner = a.opts.Runner
	args := cniplugin.PodArgs{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID), InfraContainerID: sb.ID}
	start := time.Now()
	res, err := p.Audit(ctx, conf, args, sb.NetNS, a.mode == ModeRepair, log)
	a.metrics.auditSeconds.Observe(time.Since(start).Seconds())
	if res.Skipped != "" {
		return false
	}
	if bad, ok := badinput.As(err); ok {
		a.metrics.auditErrors.Inc()
		note := fmt.Sprintf("The annotations are invalid, so the linkerd-cni agent cannot tell which rules this pod needs; its rules are left as they are: %s", bad.Error())
		log.Warn("not audited: invalid annotation; the rules are left as they are", "error", bad.Error())
		a.events.record(ctx, pod, corev1.EventTypeWarning, ReasonInvalid, ActionLeaveRules, note, true)
		return false
	}
	if err != nil && sb.Where != "" {
		// Messages name the namespace as the runtime did, not by the descriptor entered.
		err = errors.New(strings.ReplaceAll(err.Error(), sb.NetNS, sb.Where))
	}
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
			fmt.Sprintf("The redirect rules on node %s differ from the expected ones and could not be rewritten: %s. %s", a.node, err, res.Problem), true)
	case err != nil:
		a.metrics.auditErrors.Inc()
		log.Warn("audit failed", "error", err.Error())
	case !res.Drifted():
		log.Debug("rules match", "backend", res.Backend)
	case res.Healed:
		a.metrics.healed.Inc()
		log.Info("rules were missing or different; rewrote them in place", "backend", res.Backend, "problem", res.Problem)
		a.events.record(ctx, pod, corev1.EventTypeWarning, ReasonRepaired, ActionRewrite,
			fmt.Sprintf("The linkerd-cni agent on node %s found the redirect rules missing or different and rewrote them in place with %s (mode repair): %s", a.node, res.Backend, res.Problem), false)
	case a.mode == ModeDelete:
		a.deleteDrifted(ctx, pod, res.Problem)
	default:
		log.Warn("rules are missing or different (mode report: left as they are)", "problem", res.Problem)
		a.events.record(ctx, pod, corev1.EventTypeWarning, ReasonDrift, ActionReport,
			fmt.Sprintf("The linkerd-cni agent on node %s found the redirect rules missing or different and left them (mode report): %s", a.node, res.Problem), true)
	}
	return true
}

// meshedSpec tells, from the spec alone, whether the plugin writes rules for the pod; the spec
// is read the way the plugin reads it.
func meshedSpec(pod *corev1.Pod) bool {
	var spec cniplugin.PodSpec
	return recode(&pod.Spec, &spec) == nil && cniplugin.Classify(&spec).NeedsRules()
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

// ownedByController tells whether something recreates the pod after a deletion.
func ownedByController(pod *corev1.Pod) bool {
	return metav1.GetControllerOf(pod) != nil
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
