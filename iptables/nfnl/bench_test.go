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
