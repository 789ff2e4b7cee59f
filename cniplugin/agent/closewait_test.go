package agent

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	nt "github.com/kubemesh/proxy-init/internal/netnstest"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/backend"
)

// The agent writes a pod's close-wait sysctl through the node's /proc mounted elsewhere (its
// container's own /proc/sys is read-only): a per-namespace sysctl resolves in the namespace of
// the thread that opens it, whatever path reaches the procfs. /proc/self/root/proc stands for the
// mount here: another path to the same procfs.
func TestCloseWaitThroughAnotherPathToProc(t *testing.T) {
	nt.RequireRoot(t)
	other := "/proc/self/root" + iptables.CloseWaitSysctl
	pod := nt.NewNS(t)
	rs, err := iptables.Build(iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1, CloseWaitSecs: 4321, Mode: iptables.ModeNFT})
	if err != nil {
		t.Fatal(err)
	}
	read := func(path string) string {
		t.Helper()
		var v []byte
		if err := pod.Do(func() error { var err error; v, err = os.ReadFile(path); return err }); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(v))
	}
	host, err := os.ReadFile(iptables.CloseWaitSysctl)
	if err != nil {
		t.Skipf("no conntrack close-wait sysctl here: %v", err)
	}
	// The rules load conntrack in the pod's namespace; then a value set the usual way must read
	// back through the other path before anything is written through it (never the node's).
	if _, err := (backend.Runner{}).Apply(context.Background(), backend.Target{NetNS: pod.Path(), Options: backend.Options{Mode: iptables.ModeNFT}}, rs); err != nil {
		t.Fatal(err)
	}
	if err := pod.Do(func() error { return os.WriteFile(iptables.CloseWaitSysctl, []byte("1234"), 0o644) }); err != nil {
		t.Fatal(err)
	}
	if got := read(other); got != "1234" {
		t.Fatalf("through %s the pod's sysctl reads %q, want 1234: writing there would not reach the pod", other, got)
	}
	r := backend.Runner{CloseWaitFile: filepath.Join("/proc/self/root/proc/sys", iptablesCloseWait)}
	if _, err := r.Apply(context.Background(), backend.Target{NetNS: pod.Path(), Options: backend.Options{Mode: iptables.ModeNFT}}, rs); err != nil {
		t.Fatal(err)
	}
	if got := read(iptables.CloseWaitSysctl); got != "4321" {
		t.Errorf("the pod's close-wait is %q, want 4321", got)
	}
	if after, _ := os.ReadFile(iptables.CloseWaitSysctl); string(after) != string(host) {
		t.Errorf("the node's close-wait changed from %q to %q", host, after)
	}
}
