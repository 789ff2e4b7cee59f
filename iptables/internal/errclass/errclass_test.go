package errclass

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

func TestNetlink(t *testing.T) {
	ns, err := os.Readlink("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		err         error
		capability  bool
		unsupported bool
		want        string
	}{
		{fmt.Errorf("list tables: %w", unix.EPERM), true, false,
			"write: permission denied: this needs CAP_NET_ADMIN in network namespace " + ns + " (grant the container NET_ADMIN): list tables: operation not permitted"},
		{fmt.Errorf("add rule: %w", unix.ENOENT), false, true, "write: the kernel does not support this backend: add rule: no such file or directory"},
		{unix.EPROTONOSUPPORT, false, true, "write: the kernel does not support this backend: protocol not supported"},
		{unix.EBUSY, false, false, "write: device or resource busy"},
		// Marked at the socket by nfnl: kept as it is, and still unsupported.
		{fmt.Errorf("open the nf_tables netlink socket: %w: %w", iptables.ErrNotInKernel, unix.EPROTONOSUPPORT), false, true,
			"write: open the nf_tables netlink socket: the kernel offers no interface for this backend: protocol not supported"},
	} {
		got := Netlink("write", c.err)
		if got.Error() != c.want || iptables.IsCapabilityError(got) != c.capability || errors.Is(got, iptables.ErrUnsupported) != c.unsupported {
			t.Errorf("Netlink(%v) = %v (capability %v, unsupported %v)\nwant %s (capability %v, unsupported %v)",
				c.err, got, iptables.IsCapabilityError(got), errors.Is(got, iptables.ErrUnsupported), c.want, c.capability, c.unsupported)
		}
		if !errors.Is(got, c.err) && !strings.Contains(got.Error(), c.err.Error()) {
			t.Errorf("Netlink(%v) lost the kernel's error", c.err)
		}
	}
	if Netlink("write", nil) != nil {
		t.Error("no error became one")
	}
}

// A process with every capability misses none; one without CAP_NET_RAW is told so (checked by
// the root tests that drop it, cmd/proxy-init TestMissingCapability).
func TestMissing(t *testing.T) {
	netnstest.RequireRoot(t, "reads the effective capabilities of a root process")
	if m := Missing(NetAdmin, NetRaw); len(m) != 0 {
		t.Errorf("root misses %v", m)
	}
}
