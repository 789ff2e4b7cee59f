package conntrack_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/conntrack"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// readSysctl reads the close-wait sysctl of the namespace the caller is in.
func readSysctl() (string, error) {
	b, err := os.ReadFile(iptables.CloseWaitSysctl)
	return strings.TrimSpace(string(b)), err
}

// The netlink value is the sysctl's, per namespace, both ways; a value round-trips; the machine's
// own namespace keeps its value.
func TestCloseWaitIsTheNamespacesSysctl(t *testing.T) {
	netnstest.RequireRoot(t, "it sets conntrack timeouts in a namespace of its own")
	host, err := readSysctl()
	if err != nil {
		t.Skipf("no conntrack close-wait sysctl on this machine: %v", err)
	}
	ns := netnstest.NewNS(t)
	other := netnstest.NewNS(t)
	tests := []struct {
		name string
		set  func(uint32) error // how the value goes in
		get  func() (string, error)
	}{
		{"netlink in, sysctl out", conntrack.SetCloseWait, readSysctl},
		{"sysctl in, netlink out", func(v uint32) error {
			return os.WriteFile(iptables.CloseWaitSysctl, []byte(strconv.FormatUint(uint64(v), 10)), 0o644)
		}, func() (string, error) { v, err := conntrack.CloseWait(); return strconv.FormatUint(uint64(v), 10), err }},
		{"netlink round trip", conntrack.SetCloseWait, func() (string, error) {
			v, err := conntrack.CloseWait()
			return strconv.FormatUint(uint64(v), 10), err
		}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := uint32(3600 + i*1111)
			var got string
			if err := ns.Do(func() error {
				if err := tt.set(want); err != nil {
					return err
				}
				var err error
				got, err = tt.get()
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if got != fmt.Sprint(want) {
				t.Errorf("close-wait reads %s, want %d", got, want)
			}
		})
	}
	// Another namespace, and the machine's, keep their own value.
	if err := other.Do(func() error {
		v, err := conntrack.CloseWait()
		if err == nil && v == 3600+2*1111 {
			err = fmt.Errorf("another namespace reads the value set in the first: %d", v)
		}
		return err
	}); err != nil {
		t.Error(err)
	}
	if now, _ := readSysctl(); now != host {
		t.Errorf("the machine's close-wait changed from %s to %s", host, now)
	}
}

// What says the kernel lacks the subsystem is ErrUnsupported (the caller falls back to the sysctl
// file); anything else, a missing capability above all, is not.
func TestRefusals(t *testing.T) {
	for _, tt := range []struct {
		errno       unix.Errno
		unsupported bool
	}{
		{unix.EPROTONOSUPPORT, true}, {unix.EINVAL, true}, {unix.EOPNOTSUPP, true}, {unix.ENOENT, true},
		{unix.EPERM, false}, {unix.EBUSY, false},
	} {
		err := conntrack.Refused(fmt.Errorf("set: %w", tt.errno))
		if got := errors.Is(err, conntrack.ErrUnsupported); got != tt.unsupported || !errors.Is(err, tt.errno) {
			t.Errorf("%v: %v (unsupported %t), want unsupported %t and the errno kept", tt.errno, err, got, tt.unsupported)
		}
	}
}

// The answer's parser takes the value from the kernel's nested attributes and the error from an
// error message.
func TestParseCloseWait(t *testing.T) {
	attr := func(typ uint16, data []byte) []byte {
		b := binary.NativeEndian.AppendUint16(nil, uint16(4+len(data)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = append(b, data...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	msg := func(typ uint16, body []byte) []byte {
		b := binary.NativeEndian.AppendUint32(nil, uint32(16+len(body)))
		b = binary.NativeEndian.AppendUint16(b, typ)
		b = binary.NativeEndian.AppendUint16(b, unix.NLM_F_MULTI)
		b = binary.NativeEndian.AppendUint32(b, 1)
		b = binary.NativeEndian.AppendUint32(b, 0)
		return append(b, body...)
	}
	answer := func(data []byte) []byte {
		body := append([]byte{unix.AF_UNSPEC, 0, 0, 0}, attr(2, []byte{0, unix.AF_INET})...)
		body = append(body, attr(3, []byte{unix.IPPROTO_TCP})...)
		body = append(body, attr(unix.NLA_F_NESTED|4, data)...)
		return msg(unix.NFNL_SUBSYS_CTNETLINK_TIMEOUT<<8|3, body)
	}
	closeWait := append(attr(3, binary.BigEndian.AppendUint32(nil, 432000)), attr(5, binary.BigEndian.AppendUint32(nil, 77))...)
	eperm := int32(unix.EPERM)
	errMsg := msg(unix.NLMSG_ERROR, binary.NativeEndian.AppendUint32(nil, uint32(-eperm)))
	tests := []struct {
		name string
		b    []byte
		want uint32
		err  string
	}{
		{"the kernel's answer", answer(closeWait), 77, ""},
		{"an error", errMsg, 0, "operation not permitted"},
		{"no CLOSE_WAIT in it", answer(attr(3, binary.BigEndian.AppendUint32(nil, 1))), 0, "the answer holds no CLOSE_WAIT timeout"},
		{"cut short", answer(closeWait)[:20], 0, "malformed answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := conntrack.ParseCloseWait(tt.b)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("parse = %d, %v; want an error with %q", got, err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("parse = %d, %v; want %d", got, err, tt.want)
			}
		})
	}
}
