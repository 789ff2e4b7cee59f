package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/nfnl"
	"github.com/kubemesh/proxy-init/iptables/xtables"
)

// Read reads, under the shared lock and for iptables.Inspect, what of ours every backend holds
// (iptables-legacy only where /proc lists a table) and the policy routing.
func (r Runner) Read(ctx context.Context, t Target) (iptables.InPlace, error) {
	r = r.withDefaults()
	var in iptables.InPlace
	err := r.Enter(t, false, func() error {
		hs, err := nfnl.Read(ctx)
		if err != nil && (iptables.IsCapabilityError(err) || !errors.Is(err, iptables.ErrUnsupported)) {
			return err
		}
		in.Holdings = hs
		if len(xtables.LegacyTables(iptables.IPv4)) > 0 || len(xtables.LegacyTables(iptables.IPv6)) > 0 {
			a, err := xtables.New(iptables.ModeLegacy, xtables.Options{Wait: t.Wait})
			if err != nil {
				return fmt.Errorf("this namespace has iptables-legacy tables, which cannot be read: %w", err)
			}
			h, err := a.Holding(ctx)
			if err != nil {
				return err
			}
			in.Holdings = append(in.Holdings, h)
		}
		if in.Routes, err = r.Routing.Read(); err != nil {
			return fmt.Errorf("read the policy routing: %w", err)
		}
		return nil
	})
	return in, err
}
