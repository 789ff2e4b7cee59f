package nfnl

import (
	"context"
	"errors"
	"testing"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

// Where the socket itself is refused (qemu-user refuses NETLINK_NETFILTER with EPROTONOSUPPORT; a
// kernel without nf_tables does too, and a sandbox may refuse AF_NETLINK with EAFNOSUPPORT), every
// call says the kernel offers no interface for the backend, which is also an unsupported backend
// (auto passes over it); any other failure to open it is neither.
func TestSocketRefused(t *testing.T) {
	rs := iptablestest.Build(t, iptablestest.ChartConfig())
	a := New(iptables.BackendNFT, iptables.BackendNFTables)
	calls := map[string]func() error{
		"apply":   func() error { _, err := a.Apply(context.Background(), rs); return err },
		"show":    func() error { _, err := a.Show(context.Background(), rs); return err },
		"present": func() error { _, err := a.Present(context.Background()); return err },
		"cleanup": func() error { return a.Cleanup(context.Background()) },
		"xt tables": func() error {
			_, err := OurXTTables(context.Background(), iptables.IPv4)
			return err
		},
		"probe": func() error { _, err := ProbeTPROXY(context.Background()); return err },
	}
	for _, c := range []struct {
		errno       unix.Errno
		notInKernel bool
	}{
		{unix.EPROTONOSUPPORT, true},
		{unix.EAFNOSUPPORT, true},
		{unix.EMFILE, false},
	} {
		t.Run(c.errno.Error(), func(t *testing.T) {
			dialed := 0
			dialNetlink = func(int, *netlink.Config) (*netlink.Conn, error) {
				dialed++
				return nil, c.errno
			}
			t.Cleanup(func() { dialNetlink = netlink.Dial })
			for name, call := range calls {
				err := call()
				if !errors.Is(err, c.errno) || errors.Is(err, iptables.ErrNotInKernel) != c.notInKernel {
					t.Errorf("%s: %v; want the %v, not in kernel: %v", name, err, c.errno, c.notInKernel)
				}
				if c.notInKernel && (!errors.Is(err, iptables.ErrUnsupported) || iptables.IsCapabilityError(err)) {
					t.Errorf("%s: %v is not an unsupported backend", name, err)
				}
			}
			if dialed < len(calls) {
				t.Errorf("the socket was opened %d times for %d calls", dialed, len(calls))
			}
		})
	}
}
