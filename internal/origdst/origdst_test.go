package origdst

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParseSockaddr(t *testing.T) {
	sockaddr4 := func(ap netip.AddrPort) []byte {
		b := make([]byte, unix.SizeofSockaddrInet4)
		binary.NativeEndian.PutUint16(b[0:], unix.AF_INET)
		binary.BigEndian.PutUint16(b[2:], ap.Port())
		a := ap.Addr().As4()
		copy(b[4:], a[:])
		return b
	}
	sockaddr6 := func(ap netip.AddrPort) []byte {
		b := make([]byte, unix.SizeofSockaddrInet6)
		binary.NativeEndian.PutUint16(b[0:], unix.AF_INET6)
		binary.BigEndian.PutUint16(b[2:], ap.Port())
		binary.BigEndian.PutUint32(b[4:], 0xdeadbeef) // flow info, ignored
		a := ap.Addr().As16()
		copy(b[8:], a[:])
		return b
	}
	v4 := sockaddr4(netip.MustParseAddrPort("192.0.2.10:8080"))
	v6 := sockaddr6(netip.MustParseAddrPort("[2001:db8:1::20]:443"))
	bad := append([]byte(nil), v4...)
	binary.NativeEndian.PutUint16(bad[0:], unix.AF_UNIX)

	tests := []struct {
		name    string
		in      []byte
		want    netip.AddrPort // the zero AddrPort with an error
		wantErr bool
	}{
		{name: "ipv4", in: v4, want: netip.MustParseAddrPort("192.0.2.10:8080")},
		{name: "ipv4 other", in: sockaddr4(netip.MustParseAddrPort("203.0.113.99:20001")), want: netip.MustParseAddrPort("203.0.113.99:20001")},
		// The kernel may report the length of the whole buffer it was given.
		{name: "ipv4 in a sockaddr_in6-sized buffer", in: append(append([]byte(nil), v4...), make([]byte, 12)...), want: netip.MustParseAddrPort("192.0.2.10:8080")},
		{name: "ipv6", in: v6, want: netip.MustParseAddrPort("[2001:db8:1::20]:443")},
		{name: "ipv6 other", in: sockaddr6(netip.MustParseAddrPort("[2001:db8:2::99]:20001")), want: netip.MustParseAddrPort("[2001:db8:2::99]:20001")},
		{name: "short", in: v4[:3], wantErr: true},
		{name: "shorter", in: v4[:2], wantErr: true},
		{name: "empty", in: nil, wantErr: true},
		{name: "truncated ipv4", in: v4[:7], wantErr: true},
		{name: "truncated ipv6", in: v6[:unix.SizeofSockaddrInet4], wantErr: true},
		{name: "wrong family", in: bad, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseSockaddr(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parseSockaddr err = %v, wantErr %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Fatalf("parseSockaddr = %v, want %v", got, tc.want)
			}
		})
	}
}
