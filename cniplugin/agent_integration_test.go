package cniplugin_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/internal/cnitest"
	"github.com/kubemesh/proxy-init/iptables"
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
		if l := n.logTail(sb.rt.ContainerID); !strings.Contains(l, `msg="rules written"`) || !strings.Contains(l, "source=agent apiRequests=0") {
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
			return strings.Contains(l, "containerID="+sb.rt.ContainerID) && strings.Contains(l, "cmd=DEL")
		})
	}
	if l := pluginLog.String(); !strings.Contains(l, `msg="rules written"`) || !strings.Contains(l, "apiRequests=0") {
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
	a, err := agent.New(client, agent.Options{NodeName: nodeName, Socket: socket, PluginLog: pluginLog,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
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
	return socket, pluginLog, stop
}
