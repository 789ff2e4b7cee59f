package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	"github.com/kubemesh/proxy-init/test/runnertest"
)

// The socket refusal as the netlink backends report it (nfnl's dial, through errclass).
var errRefusedSocket = fmt.Errorf("remove the iptables-nft nat rules: open the nf_tables netlink socket: %w: %w",
	iptables.ErrNotInKernel, unix.EPROTONOSUPPORT)

// A backend whose kernel interface is refused outright (the nf_tables socket under qemu-user, or on
// a kernel without nf_tables) holds nothing of ours: apply, cleanup and show skip it, saying so at
// debug level, where they used to fail after the chosen backend had written. Any other failure of
// another backend, a kernel refusing one of its messages included, still fails them.
func TestOtherBackendNotInKernel(t *testing.T) {
	rs := iptablestest.Build(t, iptablestest.ChartConfig())
	for _, c := range []struct {
		name    string
		err     error // of the other backend, in every operation
		wantErr string
	}{
		{"socket refused", errRefusedSocket, ""},
		{"a message refused", fmt.Errorf("remove the iptables-nft nat rules: %w: %w", iptables.ErrUnsupported, unix.EOPNOTSUPP),
			"the kernel does not support this backend: operation not supported"},
		{"busy", unix.EBUSY, "device or resource busy"},
	} {
		t.Run(c.name, func(t *testing.T) {
			chosen, other := iptablestest.NewFake(), iptablestest.NewFake()
			for _, op := range []string{"present", "cleanup"} {
				other.Fail(op, c.err)
			}
			r := runnertest.Runner(chosen, t.TempDir()+"/close-wait")
			r.Others = func([]iptables.Backend) []iptables.Applier { return []iptables.Applier{other} }
			var log strings.Builder
			target := backendTarget(&log)
			_, applyErr := r.Apply(context.Background(), target, rs)
			_, showErr := r.Show(context.Background(), target, rs)
			_, cleanupErr := r.Cleanup(context.Background(), target)
			for op, err := range map[string]error{"apply": applyErr, "show": showErr, "cleanup": cleanupErr} {
				if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
					t.Errorf("%s: %v; want error %q", op, err, c.wantErr)
				}
			}
			skipped := strings.Count(log.String(), `level=DEBUG msg="backend skipped: the kernel offers no interface for it, so it holds nothing of ours" backend=fake`)
			if want := map[bool]int{true: 3, false: 0}[c.wantErr == ""]; skipped != want {
				t.Errorf("%d debug lines say the backend was skipped, want %d:\n%s", skipped, want, log.String())
			}
			if chosen.Calls("apply") != 1 || chosen.Calls("cleanup") != 1 {
				t.Errorf("the chosen backend applied %d and cleaned up %d times, want 1 and 1", chosen.Calls("apply"), chosen.Calls("cleanup"))
			}
		})
	}
}

// The chosen backend itself refused outright (cleanup and DEL in nftables mode on a kernel without
// nf_tables) has nothing of ours to remove: cleanup succeeds, and still clears the other backends.
func TestChosenBackendNotInKernel(t *testing.T) {
	chosen, other := iptablestest.NewFake(), iptablestest.NewFake()
	chosen.Fail("cleanup", errRefusedSocket)
	other.Set(iptables.IPv4, []string{"-A PROXY_INIT_OUTPUT -j RETURN"})
	r := runnertest.Runner(chosen, t.TempDir()+"/close-wait")
	r.Others = func([]iptables.Backend) []iptables.Applier { return []iptables.Applier{other} }
	var log strings.Builder
	if _, err := r.Cleanup(context.Background(), backendTarget(&log)); err != nil {
		t.Fatalf("cleanup: %v", err)
	}
	if other.Calls("cleanup") != 1 || other.Dump() != iptablestest.NewFake().Dump() {
		t.Errorf("the other backend was cleaned up %d times and holds:\n%s", other.Calls("cleanup"), other.Dump())
	}
	if !strings.Contains(log.String(), "backend skipped") {
		t.Errorf("no debug line says the chosen backend was skipped:\n%s", log.String())
	}
	// Show of the chosen backend is not excused: the rules the mode names cannot be read.
	chosen.Fail("show", errRefusedSocket)
	if _, err := r.Show(context.Background(), backendTarget(&log), iptablestest.Build(t, iptablestest.ChartConfig())); !errors.Is(err, iptables.ErrNotInKernel) {
		t.Errorf("show: %v; want the refusal", err)
	}
}

func backendTarget(log *strings.Builder) runner.Target {
	return runner.Target{Log: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelDebug}))}
}
