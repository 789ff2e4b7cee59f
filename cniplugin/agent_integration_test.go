package cniplugin_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"go.opentelemetry.io/otel/trace"

	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/cnitest"
)

// TestCNIWithAgent runs the plugin binary through libcni with the node agent serving its socket:
// a meshed pod is meshed with no API request (the API server's audit log), the plugin writing with
// the agent's lookup in every mode (legacy too, with the node's binaries), and the call's lines are
// in the agent's log (the plugin's report); with the agent stopped, the same ADD reads the API
// itself (two requests, as without an agent).
func TestCNIWithAgent(t *testing.T) {
	n := newNode(t, true)
	const ns = "with-agent"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	n.createPod(t, ns, "api", shapeClassic, nil, nil)

	socket, pluginLog, stop := n.startAgent(t)
	for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy} {
		list := n.conflist(t, netOpts{mode: mode, top: map[string]any{"agent": map[string]any{"socket": socket}}})
		sb := n.newSandbox(t, ns, "web")
		n.mustAdd(t, list, sb)
		expectRules(t, sb, baseConfig(mode))
		if l := n.logTail(sb.rt.ContainerID); !strings.Contains(l, `msg="rules written"`) || !strings.Contains(l, "source=agent api_requests=0") {
			t.Errorf("%s: the plugin did not write with the agent's lookup:\n%s", mode, l)
		}
		if err := n.check(list, sb); err != nil {
			t.Errorf("%s: CHECK with the agent: %v", mode, err)
		}
		if err := n.del(list, sb); err != nil {
			t.Errorf("%s: DEL with the agent: %v", mode, err)
		}
		expectNoRules(t, sb)
		waitFor(t, "the reports in the agent's plugin log", func() bool {
			l := pluginLog.String()
			return strings.Contains(l, "container_id="+sb.rt.ContainerID) && strings.Contains(l, "cmd=DEL")
		})
	}
	if l := pluginLog.String(); !strings.Contains(l, `msg="rules written"`) || !strings.Contains(l, "api_requests=0") {
		t.Errorf("the agent's plugin log lacks the ADDs:\n%s", l)
	}
	time.Sleep(time.Second) // the audit log is written asynchronously
	if evs := n.apiEvents(t, ns); len(evs) != 0 {
		t.Errorf("with the agent, the meshed pods cost %d API requests, want 0: %v", len(evs), eventURIs(evs))
	}

	stop()
	if _, err := os.Stat(socket); !os.IsNotExist(err) {
		t.Errorf("the socket outlived the agent: %v", err)
	}
	list := n.conflist(t, netOpts{mode: iptables.ModeNFT, top: map[string]any{"agent": map[string]any{"socket": socket}}})
	sb := n.newSandbox(t, ns, "api")
	n.mustAdd(t, list, sb)
	expectRules(t, sb, baseConfig(iptables.ModeNFT))
	if evs := n.waitAPIEvents(t, ns, 2); len(evs) != 2 {
		t.Errorf("without the agent, the meshed pod cost %d API requests, want 2: %v", len(evs), eventURIs(evs))
	}
}

// TestCNIWithWritingAgent runs the plugin binary through libcni with an agent that writes (route
// 1): the ADD's rules are the node's conflist entry's (the plugin's stdin is forged with other
// ports, which never reach the agent), written with no API request; the plugin's line names the
// route; CHECK and DEL (the plugin's) find the record the agent wrote and remove the rules; the
// agent counts the write from the plugin's report.
func TestCNIWithWritingAgent(t *testing.T) {
	n := newNode(t, true)
	const ns = "writing-agent"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	socket, netDir := n.startWritingAgent(t)
	top := map[string]any{"agent": map[string]any{"socket": socket}}
	writeNodeConflist(t, netDir, n.conflist(t, netOpts{mode: iptables.ModeNFT, top: top}))
	forged := n.conflist(t, netOpts{mode: iptables.ModeNFT, top: top, linkerd: map[string]any{"incoming-proxy-port": 1, "outgoing-proxy-port": 2}})
	sb := n.newSandbox(t, ns, "web")
	n.mustAdd(t, forged, sb)
	expectRules(t, sb, baseConfig(iptables.ModeNFT))
	if l := n.logTail(sb.rt.ContainerID); !strings.Contains(l, "source=agent api_requests=0 route=agent") || !strings.Contains(l, "writer=agent") {
		t.Errorf("the agent did not write the ADD:\n%s", l)
	}
	if err := n.check(forged, sb); err == nil {
		t.Error("CHECK with the forged ports passed: it should check the plugin's config against the rules of the node's")
	}
	list := n.conflist(t, netOpts{mode: iptables.ModeNFT, top: top})
	if err := n.check(list, sb); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := n.del(list, sb); err != nil {
		t.Errorf("DEL: %v", err)
	}
	expectNoRules(t, sb)
	time.Sleep(time.Second) // the audit log is written asynchronously
	if evs := n.apiEvents(t, ns); len(evs) != 0 {
		t.Errorf("route 1 cost %d API requests, want 0: %v", len(evs), eventURIs(evs))
	}
}

// waitFor polls cond for up to 10 seconds.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startAgent runs the node agent in this process, with the plugin's ServiceAccount (whose
// ClusterRole has the reads the agent watches with), serving a socket in a root-only directory of
// its own, lookups only. It returns the socket, the agent's plugin log and a function that stops
// it (also run at cleanup).
func (n *node) startAgent(t testing.TB) (string, *cnitest.SyncBuffer, func()) {
	t.Helper()
	_, socket, pluginLog, stop := n.runAgent(t)
	return socket, pluginLog, stop
}

// startWritingAgent is startAgent for an agent that writes the plugin's ADDs (route 1), as the
// chart's does with audits on: it reads the node's network config from the returned directory
// (where the test puts the conflist, after it knows the socket) and sees the pods' namespaces in
// /var/run/netns, where the test's sandboxes are pinned.
func (n *node) startWritingAgent(t testing.TB) (socket, netDir string) {
	t.Helper()
	netDir = t.TempDir()
	_, socket, _, _ = n.runAgentWith(t, netDir)
	return socket, netDir
}

// writeNodeConflist puts list in dir as the node's only conflist, where a writing agent reads it.
func writeNodeConflist(t testing.TB, dir string, list *libcni.NetworkConfigList) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(dir, "10-k8s.conflist"), list.Bytes, 0o644); err != nil {
		t.Fatal(err)
	}
}

// runAgent is startAgent, with the agent.
func (n *node) runAgent(t testing.TB) (*agent.Agent, string, *cnitest.SyncBuffer, func()) {
	t.Helper()
	return n.runAgentWith(t, "")
}

// runAgentWith is runAgent; with netDir the agent writes (startWritingAgent).
func (n *node) runAgentWith(t testing.TB, netDir string) (*agent.Agent, string, *cnitest.SyncBuffer, func()) {
	t.Helper()
	token, err := n.kube.TokenFor(context.Background(), cniNamespace, cniServiceAccount)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubeclient.New(n.kube.ConfigForToken(token))
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "cni-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	socket := filepath.Join(dir, "run", "agent.sock")
	pluginLog := &cnitest.SyncBuffer{}
	opts := agent.Options{NodeName: nodeName, Socket: socket, PluginLog: pluginLog,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if netDir != "" {
		opts.NetConf, opts.NetNSDir = &agent.NetConfSource{Dir: netDir}, "/var/run/netns"
	}
	a, err := agent.New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	deadline := time.Now().Add(30 * time.Second)
	for !a.Ready() {
		if time.Now().After(deadline) {
			t.Fatal("the agent never synced")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return a, socket, pluginLog, stop
}

// TestTraceContextThroughLibcni: libcni passes the runtime's span to the plugin binary
// (TRACEPARENT, TRACESTATE), as containerd's tracing calls it. Every line of the traced ADD,
// CHECK and DEL carries the trace ID, in the plugin's log_file and in the node agent's log of the
// calls (their reports); the agent links the calls' durations to the trace with an exemplar, not
// a label; TRACESTATE is not logged. An untraced call's lines name no trace.
func TestTraceContextThroughLibcni(t *testing.T) {
	n := newNode(t, true)
	const ns, traceID = "traced", "4bf92f3577b34da6a3ce929d0e0e4736"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	n.createPod(t, ns, "api", shapeClassic, nil, nil)
	a, socket, pluginLog, _ := n.runAgent(t)
	list := n.conflist(t, netOpts{mode: iptables.ModeNFT, top: map[string]any{"agent": map[string]any{"socket": socket}}})

	tid, err := trace.TraceIDFromHex(traceID)
	if err != nil {
		t.Fatal(err)
	}
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	state, _ := trace.ParseTraceState("congo=t61rcWkgMzE")
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: state, Remote: true}))
	traced := n.newSandbox(t, ns, "web")
	for _, cmd := range []struct {
		name string
		run  func() error
	}{
		{"ADD", func() error { _, err := n.cni.AddNetworkList(ctx, list, traced.rt); return err }},
		{"CHECK", func() error { return n.cni.CheckNetworkList(ctx, list, traced.rt) }},
		{"DEL", func() error { return n.cni.DelNetworkList(ctx, list, traced.rt) }},
	} {
		if err := n.ns.Do(cmd.run); err != nil {
			t.Fatalf("%s: %v\n%s", cmd.name, err, n.logTail(traced.rt.ContainerID))
		}
		if cmd.name == "ADD" {
			expectRules(t, traced, baseConfig(iptables.ModeNFT))
		}
	}
	untraced := n.newSandbox(t, ns, "api")
	n.mustAdd(t, list, untraced)
	waitFor(t, "the reports in the agent's plugin log", func() bool {
		l := pluginLog.String()
		return strings.Contains(l, "cmd=DEL pod=web") && strings.Contains(l, "container_id="+untraced.rt.ContainerID)
	})

	linesOf := func(log, containerID string) []string {
		var out []string
		for _, l := range strings.Split(log, "\n") {
			if strings.Contains(l, "container_id="+containerID) {
				out = append(out, l)
			}
		}
		return out
	}
	file, err := os.ReadFile(n.logFile)
	if err != nil {
		t.Fatal(err)
	}
	for where, log := range map[string]string{"log_file": string(file), "the agent's log": pluginLog.String()} {
		lines := linesOf(log, traced.rt.ContainerID)
		all := strings.Join(lines, "\n")
		for _, cmd := range []string{"cmd=ADD", "cmd=CHECK", "cmd=DEL"} {
			if !strings.Contains(all, cmd) {
				t.Errorf("%s has no %s line of the traced sandbox:\n%s", where, cmd, all)
			}
		}
		for _, l := range lines {
			if !strings.Contains(l, " trace_id="+traceID) {
				t.Errorf("%s: a traced call's line without the trace ID: %s", where, l)
			}
		}
		if strings.Contains(log, "t61rcWkgMzE") {
			t.Errorf("%s holds TRACESTATE", where)
		}
		if l := strings.Join(linesOf(log, untraced.rt.ContainerID), "\n"); l == "" || strings.Contains(l, "trace_id=") {
			t.Errorf("%s: the untraced call's lines:\n%s", where, l)
		}
	}

	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	a.Handler().ServeHTTP(rec, req)
	var exemplars []string
	for _, l := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(l, agent.MetricsPrefix+"plugin_call_duration_seconds_bucket") && strings.Contains(l, "# {") {
			exemplars = append(exemplars, l)
		}
		if strings.HasPrefix(l, agent.MetricsPrefix) && strings.Contains(l, traceID) && !strings.Contains(l, "# {") {
			t.Errorf("the trace ID in a series' labels: %s", l)
		}
	}
	if len(exemplars) == 0 || !strings.Contains(strings.Join(exemplars, "\n"), `# {trace_id="`+traceID+`"}`) {
		t.Errorf("no exemplar of the trace on the calls' durations:\n%s", strings.Join(exemplars, "\n"))
	}
}
