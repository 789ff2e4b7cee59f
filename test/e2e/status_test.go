//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// statusValues run the plugin at debug level, where each STATUS that passes logs a line.
var statusValues = map[string]any{"disableIPv6": false, "logLevel": "debug"}

// testStatus: with the node's conflist at cniVersion 1.1.0, containerd 2 calls the chain's
// STATUS every few seconds (the kubelet's runtime status check). While the API server is
// unreachable from the plugin, STATUS still passes and both nodes stay Ready. With the plugin's
// kubeconfig missing, STATUS fails and node B (only) reports NotReady with the plugin's
// message naming the kubeconfig; with the binary missing, containerd's own message; each back to
// Ready once the file is back.
func testStatus(t *testing.T, c *Cluster) {
	if c.Runtime.Name != Containerd2 {
		t.Skipf("E2E_RUNTIME=%s: containerd 1.6's libcni predates CNI 1.1.0 and never calls STATUS", c.Runtime.Name)
	}
	ctx := context.Background()
	installDaemonSetWith(ctx, t, c, statusValues)
	b := c.B()
	statusCalls := func() int { return strings.Count(b.ContainerdLog(t), "cmd=STATUS") }

	before, began := statusCalls(), time.Now()
	time.Sleep(12 * time.Second)
	calls := statusCalls() - before
	if calls < 2 {
		t.Fatalf("node %s: %d STATUS calls of the plugin in %v, want one every few seconds", b.Name, calls, time.Since(began).Round(time.Second))
	}
	t.Logf("node %s: %d STATUS calls of the plugin in %v", b.Name, calls, time.Since(began).Round(time.Second))

	// The API server unreachable for the plugin: STATUS sends nothing to it, so no node changes.
	if err := c.SetServiceIP(false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.SetServiceIP(true); err != nil {
			t.Error(err)
		}
	})
	before = statusCalls()
	for range 20 {
		for _, n := range c.Nodes {
			if ready, msg, err := n.Ready(ctx); err != nil || !ready {
				t.Errorf("node %s while the API is unreachable from the plugin: %s %v", n.Name, msg, err)
			}
		}
		time.Sleep(time.Second)
	}
	if got := statusCalls() - before; got < 2 {
		t.Errorf("node %s: %d STATUS calls while the API was unreachable, want them to go on", b.Name, got)
	}
	if err := c.SetServiceIP(true); err != nil {
		t.Fatal(err)
	}

	// The files as the installer leaves them, kept in place by hand after the DaemonSet is
	// gone, so that each can be taken away without an installer putting it back.
	files := map[string][]byte{}
	for _, f := range []string{conflistPath, kubeconfigCNI, pluginPath} {
		data, err := os.ReadFile(b.Path(f))
		if err != nil {
			t.Fatal(err)
		}
		files[f] = data
	}
	removeDaemonSet(ctx, t, c)
	restore := func(f string) {
		t.Helper()
		mode := os.FileMode(0o644)
		switch f {
		case pluginPath:
			mode = 0o755
		case kubeconfigCNI:
			mode = 0o600
		}
		if err := os.WriteFile(b.Path(f), files[f], mode); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		_ = os.WriteFile(b.Path(conflistPath), []byte(bridgeConflist(c.Runtime.CNIVersion, b.nodeSpec)), 0o644)
		_ = os.Remove(b.Path(kubeconfigCNI))
		_ = os.Remove(b.Path(pluginPath))
	})
	for _, f := range []string{kubeconfigCNI, pluginPath, conflistPath} {
		restore(f)
	}
	waitNodeReady(ctx, t, b, true, "")

	for _, tc := range []struct {
		file, want string
	}{
		{kubeconfigCNI, "linkerd-cni cannot look pods up: kubeconfig " + kubeconfigCNI},
		{pluginPath, `failed to find plugin "linkerd-cni"`},
	} {
		if err := os.Remove(b.Path(tc.file)); err != nil {
			t.Fatal(err)
		}
		msg := waitNodeReady(ctx, t, b, false, tc.want)
		t.Logf("node %s with %s missing: %s", b.Name, tc.file, msg)
		if ready, msg, err := c.A().Ready(ctx); err != nil || !ready {
			t.Errorf("node %s while node %s's %s is missing: %s %v", c.A().Name, b.Name, tc.file, msg, err)
		}
		restore(tc.file)
		waitNodeReady(ctx, t, b, true, "")
	}
}

// waitNodeReady waits until node n's Ready condition is ready and its message contains want,
// and returns the message.
func waitNodeReady(ctx context.Context, t testing.TB, n *Node, ready bool, want string) string {
	t.Helper()
	var msg string
	waitFor(ctx, t, time.Minute, fmt.Sprintf("node %s Ready=%v (%q)", n.Name, ready, want), func(ctx context.Context) (bool, error) {
		got, m, err := n.Ready(ctx)
		msg = m
		return err == nil && got == ready && strings.Contains(m, want), fmt.Errorf("%s %v", m, err)
	})
	return msg
}
