package nfnl

import (
	"fmt"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

// BenchmarkPlan1000 lays out the batch for 1,000 IPv4 subnets in a fresh namespace: the part of
// a big apply that is ours, not the kernel's (go test -bench Plan ./iptables/nfnl).
func BenchmarkPlan1000(b *testing.B) {
	c := iptablestest.ChartConfig()
	c.IPv6 = false
	for i := 0; i < 1000; i++ {
		c.InboundSubnetsToIgnore = append(c.InboundSubnetsToIgnore, fmt.Sprintf("10.%d.%d.0/24", i/256, i%256))
	}
	rs := iptablestest.Build(b, c)
	a := New(iptables.BackendNFT, iptables.BackendNFTables)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		if batch := a.PlanFresh(rs, "benchmark"); batch.err != nil {
			b.Fatal(batch.err)
		}
	}
}

// BenchmarkNativeRead maps a native table of every feature back onto the model, as CHECK, show and
// the agent's audits do for each pod (go test -bench NativeRead ./iptables/nfnl). Trying every
// kind's encoding at every position instead of reading kind by kind cost about 45 times more.
func BenchmarkNativeRead(b *testing.B) {
	c := iptablestest.EveryFeatureConfig()
	c.Mode = iptables.ModeNFTables
	t := iptablestest.Build(b, c).NFT()
	ids := map[string]uint32{}
	for i, s := range t.Sets {
		ids[s.Name] = uint32(i + 1)
	}
	var rules []rule
	for _, ch := range t.Chains {
		for _, r := range ch.Rules {
			ex, err := nativeExprs(r, ids)
			if err != nil {
				b.Fatal(err)
			}
			rules = append(rules, rule{exprs: ex, comment: r.Comment})
		}
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		for _, r := range rules {
			for _, m := range nativeRule(r).Matches {
				if m.Kind == iptables.NFTMatchUnknown {
					b.Fatalf("rule %q read back with %s", r.comment, m.Name)
				}
			}
		}
	}
}
