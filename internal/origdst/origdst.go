// Package origdst reads the original destination of a redirected TCP connection, before a nat
// REDIRECT or DNAT rewrote it, from conntrack (SO_ORIGINAL_DST, IP6T_SO_ORIGINAL_DST), as
// Linkerd's proxy does. Limits: Linux and TCP only; the connection must be tracked by conntrack
// in the namespace that accepted it (with no nat rule there, Lookup usually fails).
package origdst

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ip6tSoOriginalDst is IP6T_SO_ORIGINAL_DST from linux/netfilter_ipv6/ip6_tables.h: the same
// number as SO_ORIGINAL_DST, at level SOL_IPV6. x/sys/unix does not define it.
const ip6tSoOriginalDst = 80

// Lookup asks conntrack for the destination c had before NAT, unmapped. An IPv4 connection (also
// on a dual-stack socket) is asked at the IPv4 level first, where its entry lives, then IPv6.
func Lookup(c *net.TCPConn) (netip.AddrPort, error) {
	local := c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("raw conn: %w", err)
	}
	opts := []struct{ level, name int }{{unix.SOL_IP, unix.SO_ORIGINAL_DST}, {unix.SOL_IPV6, ip6tSoOriginalDst}}
	if !local.Is4() {
		opts = opts[1:]
	}
	var errs []error
	for _, o := range opts {
		var (
			buf  [unix.SizeofSockaddrInet6]byte
			size = uint32(len(buf))
			serr error
		)
		if err := raw.Control(func(fd uintptr) {
			// x/sys/unix has no getsockopt returning a raw sockaddr.
			_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, uintptr(o.level), uintptr(o.name),
				uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
			if errno != 0 {
				serr = errno
			}
		}); err != nil {
			return netip.AddrPort{}, fmt.Errorf("raw conn control: %w", err)
		}
		if serr == nil {
			ap, err := parseSockaddr(buf[:size])
			return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), err
		}
		errs = append(errs, fmt.Errorf("getsockopt original destination (level %d): %w", o.level, serr))
	}
	return netip.AddrPort{}, errors.Join(errs...)
}

// parseSockaddr decodes a sockaddr_in or sockaddr_in6 (family in host order, port in network).
func parseSockaddr(b []byte) (netip.AddrPort, error) {
	if len(b) < 4 {
		return netip.AddrPort{}, errors.New("short sockaddr")
	}
	family := binary.NativeEndian.Uint16(b[0:2])
	port := binary.BigEndian.Uint16(b[2:4])
	switch {
	case family == unix.AF_INET && len(b) >= unix.SizeofSockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte(b[4:8])), port), nil
	case family == unix.AF_INET6 && len(b) >= unix.SizeofSockaddrInet6:
		// Bytes 4-8 are the flow label, 24-28 the scope id (redirect targets are not link-local).
		return netip.AddrPortFrom(netip.AddrFrom16([16]byte(b[8:24])), port), nil
	}
	return netip.AddrPort{}, fmt.Errorf("unexpected sockaddr family %d, length %d", family, len(b))
}
