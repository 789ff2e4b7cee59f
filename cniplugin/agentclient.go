package cniplugin

// The node's plugin and the node agent (package cniplugin/agent, `linkerd-cni agent` in the
// DaemonSet), over the protocol of package wire. An ADD takes one of two routes:
//
//  1. the agent writes: the plugin sends a write request with the pod's network namespace as a
//     descriptor; the agent checks it against the file the runtime pinned at CNI_NETNS and writes
//     the rules of the node's own network config with this package's code (agentwriter.go);
//  2. the plugin writes, with the agent's copy of the pod (its reply when it declines to write, or
//     a lookup) or with its own API reads when the agent does not answer with the pod.
//
// CHECK asks the agent for the pod and checks itself; DEL tells the agent first, so that its
// audits leave the sandbox alone, and removes the rules itself. When the agent is absent, slow,
// not synced, does not know the pod or refuses the call, the plugin reads the API as it would
// without an agent, and says why. After the call it sends the agent a report (its result, the
// route, its duration and log lines), which becomes metrics and the agent's log.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
)

const (
	// DefaultAgentSocket is where the plugin looks for the node agent when the config has no
	// agent.socket; the DaemonSet's agent listens there.
	DefaultAgentSocket = "/var/run/linkerd-cni/agent.sock"
	// DefaultAgentTimeout bounds one exchange with the agent when the config has no
	// agent.timeout: connecting, and the agent's own bounded wait for a pod its watch has not
	// delivered yet. Past it the plugin reads the API.
	DefaultAgentTimeout = 3 * time.Second
)

// addByAgent offers an ADD to the node agent (route 1). It returns done, with the ADD's result,
// when the agent wrote the rules (or found none needed, or failed the ADD closed with a CNI
// error); otherwise the plugin writes (route 2): with the agent's copy of the pod when its reply
// held one (c.agentAPI), else with its own API reads. An agent that speaks only lookups is asked
// again for the pod, as before writes.
func (p *Plugin) addByAgent(c *call, began time.Time) (bool, error) {
	socket := c.conf.Agent.Socket
	if socket == "" {
		return false, nil // agent.socket "": never asked
	}
	// A plain open: os.Open would offer the namespace file to the poller (four more calls).
	fd, err := unix.Open(c.args.Netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		// The plugin's own write will say what is wrong with CNI_NETNS.
		c.log.Debug("cannot open the pod's network namespace to pass it to the node agent; the plugin writes", "netns", c.args.Netns, "error", err)
		return false, nil
	}
	netns := os.NewFile(uintptr(fd), c.args.Netns)
	defer netns.Close()
	start := time.Now()
	ex, err := wire.AskWrite(socket, cmp.Or(c.conf.Agent.Timeout, DefaultAgentTimeout), wire.Request{
		Namespace: c.pod.Namespace, Name: c.pod.Name, UID: c.pod.UID, ContainerID: c.args.ContainerID,
		Netns: c.args.Netns, IfName: c.args.IfName}, netns)
	took := time.Since(start)
	if wire.CodeOf(err) == wire.CodeVersion && ex == nil {
		c.log.Info("the node agent does not write (an older agent, lookups only); asking it for the pod, and the plugin writes", "socket", socket, "error", err)
		return false, nil
	}
	c.asked, c.ex = true, ex
	if ex != nil && ex.Reply.Declined != nil {
		c.log.Info("the node agent did not write the rules; the plugin writes them", "why", ex.Reply.Declined.Error())
	}
	if err != nil {
		c.logAgent(err, "the node agent did not look the pod up; reading it from the API")
		return false, nil
	}
	r := &ex.Reply
	if r.Written == nil {
		if r.Declined == nil {
			c.logAgent(errors.New("a reply to a write request with neither written nor declined"), "the node agent's answer; the plugin reads the pod from the API and writes")
			return false, nil
		}
		if c.agentAPI, err = decodeReply(r); err != nil {
			c.logAgent(err, "the node agent did not look the pod up; reading it from the API")
		}
		return false, nil
	}
	w := r.Written
	c.lookup = cmp.Or(r.Source, "agent")
	if w.Log != "" {
		_, _ = io.WriteString(c.lines, w.Log)
	}
	if w.Error != nil {
		// Closed, with the code the plugin would have returned: the agent ran the same decisions.
		c.log.Error("failed", "route", wire.RouteAgent, "error", w.Error.Msg)
		return true, &types.Error{Code: w.Error.Code, Msg: w.Error.Msg, Details: w.Error.Details}
	}
	if !Kind(w.Kind).NeedsRules() {
		c.log.Info("no rules needed", "kind", w.Kind, "source", c.lookup, "api_requests", 0, "route", wire.RouteAgent, "agent", took, "elapsed", time.Since(began))
		return true, p.printPrev(c)
	}
	c.route = wire.RouteAgent
	c.log.Info("rules written", "kind", w.Kind, "backend", w.Backend, "changed", w.Changed,
		"source", c.lookup, "api_requests", 0, "route", c.route, "close_wait_secs", w.CloseWaitSecs,
		"agent", took, "in_agent", time.Duration(w.Seconds*float64(time.Second)), "elapsed", time.Since(began))
	return true, p.printPrev(c)
}

// exchange opens the call's exchange with the node agent: the request and the agent's reply.
func (c *call) exchange() (*wire.Exchange, error) {
	socket := c.conf.Agent.Socket
	if socket == "" {
		return nil, fs.ErrNotExist // agent.socket "": never asked
	}
	ex, err := wire.Ask(socket, cmp.Or(c.conf.Agent.Timeout, DefaultAgentTimeout), wire.Request{Command: c.cmd,
		Namespace: c.pod.Namespace, Name: c.pod.Name, UID: c.pod.UID, ContainerID: c.args.ContainerID})
	c.ex = ex // set with the agent's typed refusals too: the report still goes
	return ex, err
}

// logAgent says why the agent was not used: at debug when there is none, at info when it does not
// know the pod (yet), at warning for anything that needs looking at.
func (c *call) logAgent(err error, msg string) {
	lvl := slog.LevelWarn
	switch {
	case errors.Is(err, fs.ErrNotExist):
		lvl = slog.LevelDebug
	case wire.CodeOf(err) == wire.CodeNotSeen, wire.CodeOf(err) == wire.CodeNotSynced:
		lvl = slog.LevelInfo
	}
	c.log.Log(context.Background(), lvl, msg, "socket", c.conf.Agent.Socket, "error", err)
}

// agentLookup serves a call's lookups from the agent's answer, which holds the pod and its
// namespace. Without default/kubernetes in it (the agent's watch has not delivered that Service),
// a control-plane pod skips 443 and 6443, as when the API refuses that read.
type agentLookup struct {
	pod Pod
	ns  Namespace
	svc *Service
	// nsErr, when set, is why the agent sent no namespace (wire.Reply.NamespaceError).
	nsErr string
	// source is where the agent read the pod: "agent" (its watch) or wire.SourceKubelet.
	source string
}

// decodeReply reads the agent's answer; one without the pod, or without its namespace and a
// reason for its absence, is no answer.
func decodeReply(r *wire.Reply) (*agentLookup, error) {
	if r.Source != "" && r.Source != wire.SourceKubelet {
		return nil, fmt.Errorf("the node agent's answer: unknown source %q", r.Source)
	}
	l := &agentLookup{nsErr: r.NamespaceError, source: cmp.Or(r.Source, "agent")}
	for _, o := range []struct {
		what string
		raw  json.RawMessage
		into any
	}{{"pod", r.Pod, &l.pod}, {"namespace", r.Namespace, &l.ns}, {"service", r.Service, &l.svc}} {
		if len(o.raw) == 0 && (o.what == "service" || (o.what == "namespace" && l.nsErr != "")) {
			continue
		}
		err := json.Unmarshal(o.raw, o.into)
		if err == nil && string(o.raw) == "null" {
			err = errors.New("null")
		}
		if err != nil {
			return nil, fmt.Errorf("the node agent's answer: its %s: %w", o.what, err)
		}
	}
	return l, nil
}

func (a *agentLookup) Cached() bool { return true }

func (a *agentLookup) Pod(context.Context, string, string) (*Pod, error) { return &a.pod, nil }

// Namespace fails, closed, when the agent had no namespace to send (its watch had not synced and
// the API server did not answer it): the plugin does not ask the same API server again, and a
// pod that needs its namespace's annotations waits for the runtime's retry.
func (a *agentLookup) Namespace(_ context.Context, name string) (*Namespace, error) {
	if a.nsErr != "" {
		return nil, fmt.Errorf("the node agent read the pod from the kubelet but has no namespace %s to give: %s", name, a.nsErr)
	}
	return &a.ns, nil
}

func (a *agentLookup) Service(_ context.Context, namespace, name string) (*Service, error) {
	if a.svc == nil {
		return nil, fmt.Errorf("service %s/%s: not in the node agent's answer", namespace, name)
	}
	return a.svc, nil
}
