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
// a meshed pod is meshed with no API request from the plugin (the API server's audit log), its
// call's lines are in the agent's log, and the plugin never runs its companion (it is absent, and
// in legacy mode, where the plugin writes with the agent's lookup, too); with the agent stopped,
// the same ADD reads the API itself through the companion (two requests, as without an agent).
func TestCNIWithAgent(t *testing.T) {
	n := newNode(t, true)
	const ns = "with-agent"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	n.createPod(t, ns, "api", shapeClassic, nil, nil)

	socket, pluginLog, stop := n.startAgent(t)
	list := n.conflist(t, netOpts{mode: iptables.ModeNFT, top: map[string]any{"agent": map[string]any{"socket": socket}}})
	legacy := n.conflist(t, netOpts{mode: iptables.ModeLegacy, top: map[string]any{"agent": map[string]any{"socket": socket}}})
	noCompanion := t.TempDir()
	copyFile(t, filepath.Join(binDirs[0], "linkerd-cni"), filepath.Join(noCompanion, "linkerd-cni"), 0o755)
	n.withPluginDir(t, noCompanion, func() {
		sb := n.newSandbox(t, ns, "web")
		n.mustAdd(t, list, sb)
		expectRules(t, sb, baseConfig(iptables.ModeNFT))
		if l := pluginLog.String(); !strings.Contains(l, `msg="rules written"`) || !strings.Contains(l, "containerID="+sb.rt.ContainerID) || !strings.Contains(l, "apiRequests=0") {
			t.Errorf("the agent's plugin log lacks the ADD:\n%s", l)
		}
		if err := n.check(list, sb); err != nil {
			t.Errorf("CHECK through the agent: %v", err)
		}
		if err := n.del(list, sb); err != nil {
			t.Errorf("DEL through the agent: %v", err)
		}
		expectNoRules(t, sb)

		sb = n.newSandbox(t, ns, "web")
		n.mustAdd(t, legacy, sb)
		expectRules(t, sb, baseConfig(iptables.ModeLegacy))
		if l := n.logTail(sb.rt.ContainerID); !strings.Contains(l, "the node agent looked the pod up; the plugin does the rest") {
			t.Errorf("legacy mode: the plugin did not write with the agent's lookup:\n%s", l)
		}
		if err := n.del(legacy, sb); err != nil {
			t.Errorf("DEL: %v", err)
		}
	})
	time.Sleep(time.Second) // the audit log is written asynchronously
	if evs := n.apiEvents(t, ns); len(evs) != 0 {
		t.Errorf("with the agent, the meshed pods cost %d API requests, want 0: %v", len(evs), eventURIs(evs))
	}

	stop()
	if _, err := os.Stat(socket); !os.IsNotExist(err) {
		t.Errorf("the socket outlived the agent: %v", err)
	}
	sb := n.newSandbox(t, ns, "api")
	n.mustAdd(t, list, sb)
	expectRules(t, sb, baseConfig(iptables.ModeNFT))
	if evs := n.waitAPIEvents(t, ns, 2); len(evs) != 2 {
		t.Errorf("without the agent, the meshed pod cost %d API requests, want 2: %v", len(evs), eventURIs(evs))
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
