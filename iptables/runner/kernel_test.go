package runner

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/nfnl"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

// Only the modes that write with iptables-legacy alone blame a kernel without it; auto, which
// reaches it after nf_tables refused, and the nf_tables modes never do, and a kernel with it
// leaves the write's own error.
func TestCheckKernelLegacy(t *testing.T) {
	rs := iptablestest.Build(t, iptablestest.ChartConfig())
	noLegacy := func(f iptables.Family) error { return syscall.ENOPROTOOPT }
	tproxyOK := func(context.Context) (nfnl.TPROXYSupport, error) {
		return nfnl.TPROXYSupport{XT: true, Native: true}, nil
	}
	for _, c := range []struct {
		mode    iptables.Mode
		rs      *iptables.Ruleset
		missing func(iptables.Family) error
		want    string // empty: nil
	}{
		{iptables.ModeLegacy, rs, noLegacy, "iptables mode legacy: the kernel lacks support for iptables-legacy (ipv4: protocol not available; ipv6: protocol not available)"},
		{iptables.ModeLegacy, rs, func(iptables.Family) error { return nil }, ""},
		{iptables.ModeLegacy, nil, noLegacy, ""}, // cleanup: nothing to write, nothing to blame
		{iptables.ModeAuto, rs, noLegacy, ""},
		{iptables.ModeNFT, rs, noLegacy, ""},
		{iptables.ModeNFTables, rs, noLegacy, ""},
	} {
		err := CheckKernelWith(Probes{TPROXY: tproxyOK, Legacy: c.missing})(context.Background(), c.mode, c.rs)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v; want nil", c.mode, err)
		case c.want != "" && (err == nil || !errors.Is(err, ErrKernelLacks) || len(err.Error()) < len(c.want) || err.Error()[:len(c.want)] != c.want):
			t.Errorf("%s: %v; want ErrKernelLacks starting %q", c.mode, err, c.want)
		}
	}
}
