package cniplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/kubemesh/proxy-init/internal/badinput"
)

// AuditResult is CHECK's verdict on a running pod, for the node agent.
type AuditResult struct {
	// Kind is what the pod is; only meshed kinds are checked.
	Kind Kind
	// Skipped says why nothing was checked (not meshed, an excluded namespace, simulate).
	Skipped string
	// Problem is CHECK's description of what differs; empty when the rules are exactly right.
	Problem string
	// Backend is the backend the rules were read (and, healed, written) with.
	Backend string
	// Healed is true when heal rewrote the rules.
	Healed bool
	// Edited names the annotations (and the control-plane label) that differ from those the
	// sandbox was set up with, with both values; the rules were checked against the recorded
	// ones (record.go), and the edits were not applied.
	Edited []string
	// Unrecorded says that the sandbox has no record (set up before the plugin kept them, or the
	// record was lost): the rules were checked against the current annotations.
	Unrecorded bool
}

// Drifted reports whether the pod's rules were missing or different.
func (r AuditResult) Drifted() bool { return r.Problem != "" }

// AuditLockWait bounds an audit's wait for the namespace's lock: a lock held longer costs that
// pod's audit, never the audits of the node's other pods (the agent counts it and moves on).
const AuditLockWait = time.Second

// ErrAuditLookup marks an audit that could not read the pod, its namespace or their annotations
// through the PodAPI; the rules were not looked at.
var ErrAuditLookup = errors.New("lookup failed")

// Audit is CHECK for a pod that is already running: with conf (the node's network config) and the
// annotations its sandbox (pod.InfraContainerID) was set up with, as recorded at ADD (the current
// ones, from p's PodAPI, when there is no record), it reads the rules in netns and compares them,
// naming any rule missing, different, of another backend, or a half-applied state; current
// annotations that differ from the recorded ones are named, not applied. With heal, a drifted pod
// gets its rules rewritten exactly as ADD writes them (same Runner, same namespace lock). A pod
// whose annotations are invalid is not looked at: the error is the *badinput.Error naming the
// annotation, and the rules stay as they are. The lock is waited for at most AuditLockWait: a
// *runner.BusyError in the error's chain says it was not had.
func (p *Plugin) Audit(ctx context.Context, conf *NetConf, pod PodArgs, netns string, heal bool, log *slog.Logger) (AuditResult, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	var res AuditResult
	switch {
	case conf.Excluded(pod.Namespace):
		res.Skipped = "namespace is in exclude-namespaces"
		return res, nil
	case conf.Linkerd.Simulate:
		res.Skipped = "the network config simulates"
		return res, nil
	case netns == "":
		return res, errors.New("no network namespace")
	}
	c := &call{cmd: "AUDIT", args: &skel.CmdArgs{ContainerID: pod.InfraContainerID, Netns: netns}, conf: conf, pod: pod, log: log}
	pl, edited, err := c.settle(p.podRules(c))
	res.Edited = edited
	if err != nil {
		if _, bad := badinput.As(err); bad {
			return res, err
		}
		return res, fmt.Errorf("%w: %w", ErrAuditLookup, err)
	}
	res.Kind, res.Unrecorded = pl.kind, pl.unrecorded
	if !pl.kind.NeedsRules() {
		res.Skipped = "pod is " + string(pl.kind)
		return res, nil
	}
	t := c.target(netns)
	t.LockWait = AuditLockWait
	st, err := p.Runner.Show(ctx, t, pl.rules)
	if err != nil {
		return res, fmt.Errorf("pod %s, netns %s: %w", c.podName(), netns, err)
	}
	res.Backend = st.Backend
	if err := checkState(st, pl.kind); err != nil {
		res.Problem = err.Error()
	}
	if !res.Drifted() || !heal {
		return res, nil
	}
	out, err := p.Runner.Apply(ctx, t, pl.rules)
	if err != nil {
		return res, fmt.Errorf("pod %s, netns %s: rewrite the rules: %w", c.podName(), netns, err)
	}
	res.Backend, res.Healed = out.Backend, true
	return res, nil
}
