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
	Kind    Kind   // what the pod is; only meshed kinds are checked
	Skipped string // why nothing was checked (not meshed, an excluded namespace, simulate)
	Problem string // CHECK's description of what differs; empty when the rules are exactly right
	Backend string // the backend the rules were read (and, healed, written) with
	Healed  bool   // heal rewrote the rules
	// Edited names the annotations (and the control-plane label) that differ from those the
	// sandbox was set up with, with both values: the rules were checked against the recorded ones.
	Edited []string
	// Unrecorded says that the sandbox has no record: the rules were checked against the current
	// annotations.
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

// Audit is CHECK for a running pod: with conf (the node's network config) and the annotations its
// sandbox (pod.InfraContainerID) was set up with, as recorded at ADD (else the current ones, from
// p's PodAPI), it reads the rules in netns and names any rule missing, different, of another
// backend, or a half-applied state, and any annotation edited since. With heal, a drifted pod's
// rules are rewritten as ADD writes them. Invalid annotations are a *badinput.Error, and the rules
// are left alone. A *runner.BusyError in the error's chain says the lock, waited for at most
// AuditLockWait, was not had.
func (p *Plugin) Audit(ctx context.Context, conf *NetConf, pod PodArgs, netns string, heal bool, log *slog.Logger) (AuditResult, error) {
	switch {
	case conf.Excluded(pod.Namespace):
		return AuditResult{Skipped: "namespace is in exclude-namespaces"}, nil
	case conf.Linkerd.Simulate:
		return AuditResult{Skipped: "the network config simulates"}, nil
	case netns == "":
		return AuditResult{}, errors.New("no network namespace")
	}
	c := &call{cmd: "AUDIT", args: &skel.CmdArgs{ContainerID: pod.InfraContainerID, Netns: netns}, conf: conf, pod: pod, log: log}
	pl, edited, err := c.settle(p.podRules(c))
	res := AuditResult{Edited: edited}
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
