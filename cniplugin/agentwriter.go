package cniplugin

// Route 1 (agentclient.go): the agent runs AgentAdd with the node's network config (never the
// request's) and its watch's copy of the pod. Everything ADD decides (the pod's kind, its
// annotations and their ceilings, the record of its settings, the rules, the backend, a user
// namespace's native table) is this package's, so both routes write the same rules and fail with
// the same CNI codes.

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
	"github.com/kubemesh/proxy-init/internal/logging"
	"github.com/kubemesh/proxy-init/iptables/runner"
)

// NewAgentWriter returns the plugin as the node agent runs it for a write request: pods from api
// (the agent's watch), rules through runner (the zero Runner is the real one), no node agent of
// its own, nothing printed.
func NewAgentWriter(api PodAPI, runner runner.Runner) *Plugin {
	return &Plugin{Stdout: io.Discard, Stderr: io.Discard, Runner: runner,
		NewPodAPI: func(*NetConf) (PodAPI, error) { return api, nil }}
}

// AgentAdd is one write request, as the node agent runs it.
type AgentAdd struct {
	// Conf is the node's network config, the linkerd-cni entry of the conflist the runtime reads.
	Conf *NetConf
	// Pod is the request's pod; its InfraContainerID is the request's container ID.
	Pod PodArgs
	// ContainerID is CNI_CONTAINERID, which names the record of the pod's settings.
	ContainerID string
	// NetNS is where the agent enters the pod's namespace: /proc/self/fd/N, the descriptor
	// received and checked.
	NetNS string
	// Log receives the call's lines, at the config's log level, as the plugin would log them.
	Log io.Writer
}

// NotWrittenError is an AgentAdd that wrote no rules for a reason the plugin may not share (a
// mode the agent cannot write, a write that failed in the agent, a config that simulates): the
// agent declines, and the plugin writes.
type NotWrittenError struct{ Err error }

func (e *NotWrittenError) Error() string { return e.Err.Error() }
func (e *NotWrittenError) Unwrap() error { return e.Err }

// AgentAdd runs ADD's decisions and write for the node agent. It returns what was done: a pod
// that needs no rules, the rules written, or (Written.Error, with the error) an ADD that failed
// closed with the CNI code the plugin would have returned. A *NotWrittenError says the plugin
// should write instead; an error of the pod lookup is returned as it is (the agent's watch did
// not hold the pod: the plugin reads the API).
func (p *Plugin) AgentAdd(ctx context.Context, in AgentAdd) (wire.Written, error) {
	start := time.Now()
	conf := in.Conf
	level, _ := logging.ParseLevel(conf.LogLevel)
	c := &call{cmd: "ADD", args: &skel.CmdArgs{ContainerID: in.ContainerID, Netns: in.NetNS}, conf: conf, pod: in.Pod, lookup: "agent"}
	c.log = slog.New(slog.NewTextHandler(in.Log, &slog.HandlerOptions{Level: level})).With(
		"cmd", "ADD", "pod", in.Pod.Name, "namespace", in.Pod.Namespace, "container_id", in.ContainerID, "writer", "agent")
	var w wire.Written
	switch {
	case conf.Excluded(in.Pod.Namespace):
		return w, &NotWrittenError{errors.New("the node's network config excludes the namespace")}
	case conf.Linkerd.Simulate:
		return w, &NotWrittenError{errors.New("the node's network config simulates")}
	}
	pl, err := p.podRules(c)
	if err != nil {
		if code := lookupCode(err); code != types.ErrTryAgainLater { // not a failed lookup (apiError)
			c.log.Error("failed", "error", err)
			w.Error = &wire.CNIError{Code: code, Msg: err.Error()}
		}
		w.Seconds = time.Since(start).Seconds()
		return w, err
	}
	w.Kind = string(pl.kind)
	if pl.kind.NeedsRules() {
		out, err := p.write(ctx, c, pl, in.NetNS)
		if err != nil {
			return w, &NotWrittenError{err}
		}
		w.Backend, w.Changed, w.CloseWaitSecs = out.Backend, out.Changed, pl.rules.CloseWaitSecs
	}
	w.Seconds = time.Since(start).Seconds()
	return w, nil
}
