package runner_test

import (
	"context"
	"log/slog"
	"os"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// The real Runner sets the close-wait timeout over netlink, not through the sysctl file (which a
// container with a read-only /proc/sys could not write), in the target namespace only, and Show
// reads back what the sysctl shows, a change made there included.
func TestRunnerSetsCloseWaitOverNetlink(t *testing.T) {
	nt.RequireRoot(t)
	host, err := os.ReadFile(iptables.CloseWaitSysctl)
	if err != nil {
		t.Skipf("no conntrack close-wait sysctl here: %v", err)
	}
	n := nt.NewNS(t)
	c := suiteConfig()
	c.Mode, c.CloseWaitSecs = iptables.ModeNFTables, 4321
	rs, err := iptables.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	target := runner.Target{NetNS: n.Path(), Options: runner.Options{Mode: iptables.ModeNFTables},
		Log: slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	if _, err := (runner.Runner{}).Apply(context.Background(), target, rs); err != nil {
		t.Fatal(err)
	}
	sysctl := func() string {
		t.Helper()
		var b []byte
		if err := n.Do(func() (err error) { b, err = os.ReadFile(iptables.CloseWaitSysctl); return err }); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	if got := sysctl(); got != "4321" {
		t.Errorf("the namespace's close-wait sysctl reads %s, want 4321", got)
	}
	if !strings.Contains(log.String(), `msg="conntrack close-wait timeout set" seconds=4321`) || strings.Contains(log.String(), "file") {
		t.Errorf("the timeout was not set over netlink alone; log:\n%s", log.String())
	}
	if now, _ := os.ReadFile(iptables.CloseWaitSysctl); string(now) != string(host) {
		t.Errorf("the machine's close-wait changed from %q to %q", host, now)
	}

	for _, tt := range []struct {
		sysctl string // written into the namespace's sysctl first; "" writes nothing
		want   iptables.SysctlState
	}{
		{"", iptables.SysctlState{File: iptables.CloseWaitSysctl, Want: "4321", Have: "4321"}},
		{"1234", iptables.SysctlState{File: iptables.CloseWaitSysctl, Want: "4321", Have: "1234"}},
	} {
		if tt.sysctl != "" {
			if err := n.Do(func() error { return os.WriteFile(iptables.CloseWaitSysctl, []byte(tt.sysctl), 0o644) }); err != nil {
				t.Fatal(err)
			}
		}
		st, err := (runner.Runner{}).Show(context.Background(), target, rs)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Sysctls) != 1 || st.Sysctls[0] != tt.want {
			t.Errorf("with the sysctl at %q, Show reads %+v, want %+v", tt.sysctl, st.Sysctls, tt.want)
		}
	}
}
