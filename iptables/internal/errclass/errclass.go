// Package errclass sorts the kernel's answers to the backends into the errors they promise: a
// refused permission becomes a *iptables.CapabilityError naming what to grant, and a kernel
// without the backend's features iptables.ErrUnsupported. It reads /proc and changes nothing.
package errclass

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
)

// Capabilities, as the kernel and `capsh` name them.
const (
	NetAdmin = "CAP_NET_ADMIN"
	NetRaw   = "CAP_NET_RAW"
)

// Netlink classifies an error of a netlink backend, which needs CAP_NET_ADMIN: op says what was
// being done ("write the iptables-nft nat rules").
func Netlink(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, iptables.ErrNotInKernel):
		return fmt.Errorf("%s: %w", op, err)
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		return Denied(op, err, NetAdmin)
	case errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EAFNOSUPPORT) ||
		errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EINVAL):
		// ENOENT: an expression, match or target the kernel cannot load; EOPNOTSUPP and EINVAL:
		// one it has but refuses here; the other two: no nf_tables netlink at all.
		return fmt.Errorf("%s: %w: %w", op, iptables.ErrUnsupported, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// Denied returns the *iptables.CapabilityError for op in the calling thread's namespace.
func Denied(op string, err error, caps ...string) error {
	return &iptables.CapabilityError{Caps: caps, NetNS: netnsutil.Current(), Op: op, Err: err}
}

// Missing returns those of caps the calling thread lacks; unreadable ones count as held.
func Missing(caps ...string) []string {
	var data [2]unix.CapUserData // capabilities 0-31, 32-63
	if unix.Capget(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &data[0]) != nil {
		return nil
	}
	capBits := map[string]uint{NetAdmin: unix.CAP_NET_ADMIN, NetRaw: unix.CAP_NET_RAW}
	var out []string
	for _, c := range caps {
		if data[capBits[c]/32].Effective&(1<<(capBits[c]%32)) == 0 {
			out = append(out, c)
		}
	}
	return out
}
