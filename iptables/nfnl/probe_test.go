package nfnl

import (
	"testing"

	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// The probe tells what the kernel has and writes nothing: the table list and the generation are
// what they were. (This kernel has both TPROXYs; a kernel without is stood in for by the
// Runner's Kernel seam in the backend's and proxy-init's tests.)
func TestProbeTPROXYWritesNothing(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	mustRun(t, n, "", "nft", "add", "table", "ip", "mangle")
	before := state(t, n)
	var got TPROXYSupport
	in(t, n, func() (err error) {
		got, err = ProbeTPROXY(ctx(t))
		return err
	})
	if !got.XT || !got.Native {
		t.Errorf("this kernel has TPROXY, the probe says %+v", got)
	}
	after := state(t, n)
	if after.gen != before.gen || len(after.tables) != len(before.tables) {
		t.Errorf("the probe changed the ruleset: generation %d -> %d, tables %+v -> %+v", before.gen, after.gen, before.tables, after.tables)
	}
}
