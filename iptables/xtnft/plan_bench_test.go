package xtnft

import (
	"fmt"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
)

// BenchmarkPlan1000 lays out the batch for 1,000 IPv4 subnets in a fresh namespace: the part of
// a big apply that is ours, not the kernel's (go test -bench Plan ./iptables/xtnft).
func BenchmarkPlan1000(b *testing.B) {
	c := iptables.GoldenConfigs()["chart-defaults"]
	c.IPv6 = false
	for i := 0; i < 1000; i++ {
		c.InboundSubnetsToIgnore = append(c.InboundSubnetsToIgnore, fmt.Sprintf("10.%d.%d.0/24", i/256, i%256))
	}
	rs, err := iptables.Build(c)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s := &state{nat: map[byte]*natTable{}}
		if err := s.apply(newBatch(1), rs); err != nil {
			b.Fatal(err)
		}
	}
}
