package xtnft

import (
	"errors"
	"testing"

	"golang.org/x/sys/unix"

	nt "github.com/kubemesh/proxy-init/internal/netnstest"
	"github.com/kubemesh/proxy-init/iptables"
)

// A transaction planned from a read that another writer overtook is refused whole (the kernel
// checks the generation it names), so Apply plans again instead of acting on a stale read.
func TestStalePlanRefused(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	rs, err := iptables.Build(iptables.GoldenConfigs()["chart-defaults"])
	if err != nil {
		t.Fatal(err)
	}
	err = n.Do(func() error {
		c, err := dial()
		if err != nil {
			return err
		}
		defer c.close()
		s, err := read(c)
		if err != nil {
			return err
		}
		m := newBatch(s.genID)
		if err := s.apply(m, rs); err != nil {
			return err
		}
		// Another writer, between our read and our write.
		if out, err := nt.RunIn(t, n, "nft", "add table inet other"); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return c.commit(m)
	})
	var be *batchError
	if !errors.As(err, &be) || be.err != unix.ERESTART {
		t.Fatalf("commit of a stale plan: %v; want ERESTART", err)
	}
	if out, _ := nt.RunIn(t, n, "nft", "list tables"); out != "table inet other\n" {
		t.Errorf("the refused transaction wrote something:\n%s", out)
	}
}
