package cniplugin

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
	"github.com/kubemesh/proxy-init/internal/buildinfo"
	"github.com/kubemesh/proxy-init/internal/logging"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
)

// about is the plugin's one-line description for skel.
func about() string {
	return "linkerd-cni " + buildinfo.Version + ": Linkerd-compatible transparent-proxy redirect, as a chained CNI plugin"
}

// applyTimeout bounds writing, reading back or removing the rules in one namespace.
const applyTimeout = 60 * time.Second

// Plugin runs the CNI commands in the role its constructor gives it: NewNodePlugin (the runtime's),
// NewStandalone (pods from a given PodAPI alone) or NewAgentWriter. The fields are seams for tests.
type Plugin struct {
	// Stdout receives the CNI result and nothing else.
	Stdout io.Writer
	// Stderr receives the log lines (and log_file, when configured, a copy).
	Stderr io.Writer
	// NewPodAPI builds the client of the API server, for the pods the node agent does not serve.
	NewPodAPI func(*NetConf) (PodAPI, error)
	// Runner writes, reads and removes the rules in the pod's namespace; the zero Runner is the
	// real one, the same path proxy-init takes.
	Runner runner.Runner
	// nodeAgent is NewNodePlugin's: ADD and CHECK ask the node agent for the pod, DEL tells it.
	nodeAgent bool
	// started is when PluginMain began, the start of the duration a call reports (its stdin and
	// config read included); zero for other callers, whose calls count from their own start.
	started time.Time
}

// NewNodePlugin returns the plugin the container runtime runs, on the process's stdout and
// stderr: the pod from the node agent, else the kubelet, else the API server.
func NewNodePlugin() *Plugin {
	return &Plugin{Stdout: os.Stdout, Stderr: os.Stderr, NewPodAPI: NewKubeClient, nodeAgent: true}
}

// NewStandalone returns a plugin that reads pods from api alone and never asks a node agent, on
// the process's stdout and stderr.
func NewStandalone(api PodAPI) *Plugin {
	return &Plugin{Stdout: os.Stdout, Stderr: os.Stderr, NewPodAPI: func(*NetConf) (PodAPI, error) { return api, nil }}
}

// Funcs returns the CNI command table for skel.PluginMainFuncs.
func (p *Plugin) Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: p.Add, Check: p.Check, Del: p.Del, Status: p.Status, GC: p.GC}
}

// PodArgs are the Kubernetes keys of CNI_ARGS.
type PodArgs struct {
	Namespace        string // K8S_POD_NAMESPACE
	Name             string // K8S_POD_NAME
	InfraContainerID string // K8S_POD_INFRA_CONTAINER_ID
	UID              string // K8S_POD_UID
}

// ParseCNIArgs reads CNI_ARGS ("K1=v1;K2=v2"). Unknown keys are ignored; an element without "="
// is an error, because a garbled CNI_ARGS could otherwise hide a meshed pod.
func ParseCNIArgs(s string) (PodArgs, error) {
	var a PodArgs
	if strings.TrimSpace(s) == "" {
		return a, nil
	}
	keys := map[string]*string{"K8S_POD_NAMESPACE": &a.Namespace, "K8S_POD_NAME": &a.Name,
		"K8S_POD_INFRA_CONTAINER_ID": &a.InfraContainerID, "K8S_POD_UID": &a.UID}
	for _, kv := range strings.Split(s, ";") {
		if kv == "" {
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return PodArgs{}, fmt.Errorf("CNI_ARGS %q: element %q is not KEY=VALUE", s, kv)
		}
		if dst := keys[k]; dst != nil {
			*dst = v
		}
	}
	return a, nil
}

// call is one plugin invocation: its inputs, parsed once, its logger and, in the node's plugin,
// its exchange with the node agent.
type call struct {
	cmd  string
	args *skel.CmdArgs
	conf *NetConf
	pod  PodArgs
	log  *slog.Logger
	// own holds the call's log lines, for the report to the node agent; lines is where they go
	// (stderr, log_file, own), for the lines the agent logged when it wrote.
	own      *bytes.Buffer
	lines    io.Writer
	closeLog func()
	// ex is the open exchange with the node agent (nil without one); lookup is where the pod came
	// from: "agent", "kubelet" (through the agent or read by the plugin), "api" or "none".
	ex     *wire.Exchange
	lookup string
	// asked says the call asked the node agent already (a write request): its lookup, when the
	// reply held one, is agentAPI, and the agent is not asked again.
	asked    bool
	agentAPI *agentLookup
	route    string // who wrote an ADD's rules: wire.RouteAgent or wire.RoutePlugin ("": none)
	trace    traceContext
	started  time.Time // the start of the duration reported to the node agent
}

func (c *call) podName() string { return c.pod.Namespace + "/" + c.pod.Name }

// start parses CNI_ARGS and opens the logger. The logger exists even when the config is bad, so
// that the failure itself is logged with the pod it concerns.
func (p *Plugin) start(cmd string, args *skel.CmdArgs, conf *NetConf) (*call, error) {
	pod, argErr := ParseCNIArgs(args.Args)
	level, logFile := slog.LevelInfo, ""
	if conf != nil {
		level, _ = logging.ParseLevel(conf.LogLevel)
		logFile = conf.LogFile
	}
	c := &call{cmd: cmd, args: args, conf: conf, pod: pod, own: &bytes.Buffer{}, lookup: "none", trace: readTrace(),
		started: cmp.Or(p.started, time.Now())}
	attrs := []any{"cmd", cmd, "pod", pod.Name, "namespace", pod.Namespace, "container_id", args.ContainerID}
	if c.trace.id != "" {
		attrs = append(attrs, "trace_id", c.trace.id)
	}
	c.log, c.lines, c.closeLog = newLogger(io.MultiWriter(p.Stderr, c.own), level, logFile, attrs...)
	if t := c.trace; t.malformed != "" {
		c.log.Debug("ignoring "+EnvTraceParent+": not a W3C traceparent", "traceparent", t.malformed, "error", t.why)
	}
	return c, argErr
}

// end reports the call to the node agent when one was asked (its result, CNI error code, where
// the pod came from, its duration and its log lines), and closes the log file.
func (c *call) end(err error) {
	if c.ex != nil {
		r := wire.Report{Command: c.cmd, Result: "ok", Lookup: c.lookup, Route: c.route, Seconds: time.Since(c.started).Seconds(), Log: c.own.String(), TraceID: c.trace.id}
		if err != nil {
			r.Result = "error"
			var ce *types.Error
			if errors.As(err, &ce) {
				r.Code = ce.Code
			}
		}
		c.ex.Report(r)
	}
	c.closeLog()
}

// begin starts an ADD or CHECK, which both need a valid config and valid CNI_ARGS (no prevResult:
// without one the plugin runs alone, as a Multus NetworkAttachmentDefinition). The returned call
// is usable (and must be ended) even on error.
func (p *Plugin) begin(cmd string, args *skel.CmdArgs) (*call, error) {
	conf, confErr := ParseConfig(args.StdinData)
	c, argErr := p.start(cmd, args, conf)
	switch {
	case confErr != nil:
		return c, c.fail(types.ErrInvalidNetworkConfig, confErr)
	case argErr != nil:
		return c, c.fail(types.ErrInvalidEnvironmentVariables, argErr)
	}
	return c, nil
}

// fail logs err and returns it as the CNI error the runtime shows.
func (c *call) fail(code uint, err error) error {
	c.log.Error("failed", "error", err)
	return types.NewError(code, err.Error(), "")
}

// Add writes the rules into a meshed pod's namespace and passes prevResult through (or prints an
// empty result when it runs alone); docs/cni-plugin.md has the failure policy.
func (p *Plugin) Add(args *skel.CmdArgs) (err error) {
	began := time.Now()
	c, err := p.begin("ADD", args)
	defer func() { c.end(err) }()
	if err != nil {
		return err
	}
	conf := c.conf
	if c.pod.Namespace == "" || c.pod.Name == "" {
		c.log.Info("no K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS; not a Kubernetes pod, passing through")
		return p.printPrev(c)
	}
	if conf.Excluded(c.pod.Namespace) {
		c.log.Info("namespace is in exclude-namespaces; passing through without an API call")
		return p.printPrev(c)
	}

	// The lookup's time includes a write request the agent declined: its reply held the pod.
	lookupStart := time.Now()
	if p.nodeAgent && args.Netns != "" && !conf.Linkerd.Simulate {
		if done, err := p.addByAgent(c, began); done {
			return err
		}
	}
	pl, err := p.podRules(c)
	lookupTook := time.Since(lookupStart)
	c.noteLookup(err)
	if err != nil {
		return c.fail(lookupCode(err), err)
	}
	if !pl.kind.NeedsRules() {
		c.log.Info("no rules needed", "kind", pl.kind, "source", c.lookup, "api_requests", pl.requests, "lookup", lookupTook, "elapsed", time.Since(began))
		return p.printPrev(c)
	}
	if args.Netns == "" {
		// An empty target would act on the current namespace: the node's. Never.
		return c.fail(types.ErrInvalidEnvironmentVariables, fmt.Errorf("meshed pod %s: CNI_NETNS is empty; refusing to write rules outside the pod's namespace", c.podName()))
	}
	applyStart := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	if conf.Linkerd.Simulate {
		c.log.Info("simulate: not writing rules", "kind", pl.kind, "rules", p.Runner.Simulate(ctx, c.target(args.Netns), pl.rules))
		return p.printPrev(c)
	}
	out, err := p.write(ctx, c, pl, args.Netns)
	if err != nil {
		return c.fail(types.ErrInternal, err)
	}
	c.route = wire.RoutePlugin
	c.log.Info("rules written", "kind", pl.kind, "backend", out.Backend, "changed", out.Changed,
		"source", c.lookup, "api_requests", pl.requests, "route", c.route, "close_wait_secs", pl.rules.CloseWaitSecs,
		"lookup", lookupTook, "apply", time.Since(applyStart), "elapsed", time.Since(began))
	return p.printPrev(c)
}

// write is ADD's write, on both routes: the record of the pod's settings first (rules are never
// in place without it; a failed ADD's DEL removes it), then the rules, in netns.
func (p *Plugin) write(ctx context.Context, c *call, pl *podRules, netns string) (runner.Outcome, error) {
	if err := c.writeRecord(pl.inputs); err != nil {
		return runner.Outcome{}, fmt.Errorf("pod %s: %w", c.podName(), err)
	}
	out, err := p.Runner.Apply(ctx, c.target(netns), pl.rules)
	if err != nil {
		return out, fmt.Errorf("pod %s, netns %s: %w", c.podName(), netns, err)
	}
	return out, nil
}

// Check verifies that the rules in the pod's namespace are exactly the expected ones: those of
// the current config and annotations for a meshed pod, none at all for an unmeshed one. A pod
// with linkerd-init, an excluded namespace or a simulated config is not checked.
func (p *Plugin) Check(args *skel.CmdArgs) (err error) {
	c, err := p.begin("CHECK", args)
	defer func() { c.end(err) }()
	if err != nil {
		return err
	}
	conf := c.conf
	if c.pod.Namespace == "" || c.pod.Name == "" || conf.Excluded(c.pod.Namespace) || conf.Linkerd.Simulate {
		c.log.Debug("nothing of ours to check")
		return nil
	}
	pl, _, err := c.settle(p.podRules(c))
	if err != nil {
		return c.fail(lookupCode(err), err)
	}
	if pl.kind == KindLinkerdInit {
		c.log.Debug("pod has linkerd-init, which owns its rules; not checked")
		return nil
	}
	if args.Netns == "" {
		return c.fail(types.ErrInvalidEnvironmentVariables, fmt.Errorf("pod %s: CNI_NETNS is empty; nothing to check", c.podName()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	st, err := p.Runner.Show(ctx, c.target(args.Netns), pl.rules)
	if err == nil {
		err = checkState(st, pl.kind)
	}
	if err != nil {
		return c.fail(types.ErrInternal, fmt.Errorf("CHECK pod %s, netns %s: %w", c.podName(), args.Netns, err))
	}
	c.log.Debug("rules match", "kind", pl.kind)
	return nil
}

// Del removes our rules from the pod's namespace if it still exists. It never fails (the rules die
// with the namespace, and a failing DEL would block sandbox teardown): problems are logged. The
// node agent hears of it first, so that its audits leave the sandbox alone.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	conf, confErr := ParseConfigLenient(args.StdinData)
	c, _ := p.start("DEL", args, conf)
	defer c.end(nil)
	if confErr != nil {
		c.log.Error("cannot parse the network config; nothing removed", "error", confErr)
		return nil
	}
	if p.nodeAgent {
		if _, err := c.exchange(); err != nil {
			c.logAgent(err, "the node agent was not told of the DEL")
		}
	}
	c.removeRecord()
	switch {
	case args.Netns == "":
		c.log.Debug("no netns; nothing to remove")
		return nil
	case conf.Linkerd.Simulate || conf.Excluded(c.pod.Namespace):
		c.log.Debug("simulated or excluded: nothing was written")
		return nil
	}
	if _, err := os.Stat(args.Netns); err != nil {
		c.log.Debug("netns is gone; nothing to remove", "netns", args.Netns, "error", err)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), applyTimeout)
	defer cancel()
	if _, err := p.Runner.Cleanup(ctx, c.target(args.Netns)); err != nil {
		c.log.Warn("could not remove rules; they go with the netns", "netns", args.Netns, "error", err)
		return nil
	}
	c.log.Debug("rules removed", "netns", args.Netns)
	return nil
}

// Status reports whether the plugin can work: a valid config, a kubeconfig the API client accepts,
// and credentials not refused for longer than kubernetes.status-unauthorized-after (refused.go).
// It sends nothing to the API.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	conf, confErr := ParseConfig(args.StdinData)
	c, _ := p.start("STATUS", args, conf)
	defer c.closeLog()
	if confErr != nil {
		return c.fail(types.ErrInvalidNetworkConfig, confErr)
	}
	if _, err := p.NewPodAPI(conf); err != nil {
		return c.fail(types.ErrPluginNotAvailable, fmt.Errorf("linkerd-cni cannot look pods up: %w", err))
	}
	if err := c.refusedTooLong(time.Now()); err != nil {
		return c.fail(types.ErrPluginNotAvailable, err)
	}
	c.log.Debug("ready: config valid, kubeconfig readable (the API server is not contacted)")
	return nil
}

// GC collects nothing: the rules live in the pods' namespaces, and the node agent sweeps the
// records and lock files of sandboxes gone without a DEL.
func (p *Plugin) GC(*skel.CmdArgs) error { return nil }

// target is the pod's namespace, with the config's backend, whose choice is logged at debug:
// every ADD logs the backend it wrote with.
func (c *call) target(netns string) runner.Target {
	l := c.conf.Linkerd
	return runner.Target{
		Options:     runner.Options{Mode: l.Mode, Wait: l.UseWaitFlag},
		NetNS:       netns,
		Log:         c.log,
		ChoiceLevel: slog.LevelDebug,
		// The host lock: no process in the pod can hold it (backend's lock.go). DEL removes it.
		HostLockDir:    filepath.Join(c.conf.StateDir, LocksDir),
		RemoveHostLock: c.cmd == "DEL",
	}
}

// checkState is CHECK's verdict on the rules read back: exactly the expected ones for a meshed
// pod, and none of ours in any backend for an unmeshed one.
func checkState(st iptables.State, kind Kind) error {
	var problems []string
	for _, h := range []string{st.HalfApplied(), st.WrittenWithout()} {
		if h != "" && kind.NeedsRules() {
			problems = append(problems, h)
		}
	}
	for _, f := range st.Families {
		switch {
		case kind.NeedsRules() && !f.Diff.Empty():
			problems = append(problems, fmt.Sprintf("%s: %s", f.Family, f.Diff.String()))
		case !kind.NeedsRules() && len(f.Rules) > 0:
			problems = append(problems, fmt.Sprintf("%s: unmeshed pod has rules: extra: %s", f.Family, strings.Join(f.Rules, "\nextra: ")))
		}
	}
	for _, e := range st.Elsewhere {
		problems = append(problems, fmt.Sprintf("%s also holds rules of ours: extra: %s", e.Backend, strings.Join(e.Rules, "\nextra: ")))
	}
	for _, sc := range st.Sysctls {
		if kind.NeedsRules() && !sc.Match() {
			problems = append(problems, fmt.Sprintf("%s is %s, want %s", sc.File, sc.Have, sc.Want))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("rules (%s) differ from the expected ones for a %s pod:\n%s", st.Backend, kind, strings.Join(problems, "\n"))
	}
	return nil
}

// printPrev writes prevResult, converted to the config's CNI version, as the result. Run alone,
// the plugin prints an empty result (as Linkerd's does), which Multus needs to see a success.
func (p *Plugin) printPrev(c *call) error {
	var res types.Result
	var err error
	if c.conf.PrevResult == nil {
		// Parsed rather than converted: before 0.3.0 a result without an address cannot be
		// converted to, but it can be written.
		res, err = version.NewResult(c.conf.CNIVersion, []byte(`{"cniVersion":"`+c.conf.CNIVersion+`"}`))
	} else {
		res, err = c.conf.PrevResult.GetAsVersion(c.conf.CNIVersion)
	}
	if err != nil {
		return c.fail(types.ErrIncompatibleCNIVersion, fmt.Errorf("convert prevResult to CNI version %s: %w", c.conf.CNIVersion, err))
	}
	if err := res.PrintTo(p.Stdout); err != nil {
		return c.fail(types.ErrIOFailure, fmt.Errorf("write the result: %w", err))
	}
	return nil
}

// podRules is what the API says about a pod, turned into rules.
type podRules struct {
	kind       Kind
	settings   Settings
	rules      *iptables.Ruleset
	requests   int
	inputs     Inputs // what settings were merged from (record.go)
	unrecorded bool   // CHECK or an audit found no record of inputs, and used now's
}

// apiError marks failures to learn about the pod, which the runtime should retry.
type apiError struct{ error }

func (e apiError) Unwrap() error { return e.error }

func lookupCode(err error) uint {
	var ae apiError
	if errors.As(err, &ae) {
		return types.ErrTryAgainLater
	}
	return types.ErrInvalidNetworkConfig
}

// podRules looks the pod up, its namespace only if an annotation may be inherited, and
// default/kubernetes only for control-plane pods, within the config's API timeout. A failure is
// an error: the pod might be meshed, and must not start unmeshed.
func (p *Plugin) podRules(c *call) (*podRules, error) {
	t0 := time.Now()
	api, err := p.podAPI(c)
	clientTook := time.Since(t0)
	if err != nil {
		return nil, apiError{fmt.Errorf("pod %s might be meshed and cannot be looked up: %w", c.podName(), err)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.conf.APITimeout())
	defer cancel()
	pl := &podRules{}
	count := func() {
		if a, ok := api.(interface{ APIRequests() int }); ok { // the kubelet's pod, the rest from the API
			pl.requests = a.APIRequests()
		} else if ca, ok := api.(Cached); !ok || !ca.Cached() {
			pl.requests++
		}
	}
	t1 := time.Now()
	pod, err := api.Pod(ctx, c.pod.Namespace, c.pod.Name)
	c.log.Debug("pod looked up", "source", c.lookup, "client", clientTook, "pod_get", time.Since(t1))
	count()
	if err != nil {
		return nil, apiError{fmt.Errorf("pod %s might be meshed and cannot be looked up (timeout %s): %w", c.podName(), c.conf.APITimeout(), err)}
	}
	pl.kind = Classify(&pod.Spec)
	if !pl.kind.NeedsRules() {
		// Rules for CHECK to look for: none are expected, but reading them back needs a ruleset.
		pl.rules = c.conf.baseRules
		return pl, nil
	}
	pl.inputs = Inputs{Pod: honoured(pod.Annotations), ControlPlane: IsControlPlane(pod.Labels)}
	if NeedsNamespace(pod.Annotations) {
		ns, err := api.Namespace(ctx, c.pod.Namespace)
		count()
		if err != nil {
			return nil, apiError{fmt.Errorf("meshed pod %s: its namespace's annotations cannot be read (timeout %s): %w", c.podName(), c.conf.APITimeout(), err)}
		}
		pl.inputs.Namespace = honoured(ns.Annotations)
	}
	if pl.inputs.ControlPlane {
		svc, err := api.Service(ctx, "default", "kubernetes")
		count()
		if err == nil {
			pl.inputs.APIServerPorts = APIServerPorts(svc)
		}
		if len(pl.inputs.APIServerPorts) == 0 {
			c.log.Warn("control-plane pod: cannot read the ports of Service default/kubernetes; skipping 443 and 6443", "error", err)
			pl.inputs.APIServerPorts = FallbackAPIServerPorts
		}
	}
	if pl.settings, err = pl.inputs.merge(c); err != nil {
		return pl, err // with its inputs: a record of the sandbox's may still settle it
	}
	pl.rules = pl.settings.Rules
	if len(pl.settings.Sources) > 0 {
		c.log.Debug("annotations applied", "overrides", describeSources(pl.settings.Sources))
	}
	return pl, nil
}

// podAPI is where the call reads the pod: the node agent's answer (its exchange kept open for the
// report), else the kubelet's pods API (which needs neither the API server nor a token), else the
// API server.
func (p *Plugin) podAPI(c *call) (PodAPI, error) {
	if p.nodeAgent && c.agentAPI == nil && !c.asked {
		ex, err := c.exchange()
		if err == nil {
			c.agentAPI, err = decodeReply(&ex.Reply)
		}
		if err != nil {
			c.logAgent(err, "the node agent did not look the pod up; reading it from the API")
		}
	}
	if c.agentAPI != nil {
		c.lookup = c.agentAPI.source
		return c.agentAPI, nil
	}
	if p.nodeAgent {
		if api := c.askKubelet(func() (PodAPI, error) { return p.NewPodAPI(c.conf) }); api != nil {
			c.lookup = wire.SourceKubelet
			return api, nil
		}
	}
	c.lookup = "api"
	return p.NewPodAPI(c.conf)
}

// askKubelet reads the call's pod from the kubelet's pods API; nil when the kubelet does not give it.
func (c *call) askKubelet(newAPI func() (PodAPI, error)) *kubeletLookup {
	socket := c.conf.Kubernetes.KubeletPodsSocket
	if socket == "" {
		return nil // kubernetes.kubelet-pods-socket "": never asked
	}
	ctx, cancel := context.WithTimeout(context.Background(), kubeletTimeout)
	defer cancel()
	k := newKubeletClient(socket)
	defer k.close()
	pod, err := k.pod(ctx, c.pod.Namespace, c.pod.Name, c.pod.UID)
	if err != nil {
		// No socket: a kubelet before 1.36, its PodsAPI gate off, or another root dir.
		lvl := slog.LevelWarn
		if errors.Is(err, fs.ErrNotExist) {
			lvl = slog.LevelDebug
		}
		c.log.Log(context.Background(), lvl, "the kubelet did not give the pod; reading it from the API", "socket", socket, "error", err)
		return nil
	}
	return &kubeletLookup{pod: pod, api: sync.OnceValues(newAPI)}
}

func describeSources(src map[string]string) string {
	var parts []string
	for _, a := range Annotations {
		for field, from := range src {
			if strings.HasPrefix(from, "annotation "+a+" ") {
				parts = append(parts, field+" from "+from)
			}
		}
	}
	return strings.Join(parts, ", ")
}
