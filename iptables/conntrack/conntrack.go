// Package conntrack sets and reads the conntrack TCP CLOSE_WAIT timeout of the calling thread's
// network namespace over nfnetlink's cttimeout subsystem: the value its
// nf_conntrack_tcp_timeout_close_wait sysctl shows, without needing a writable /proc/sys, only
// CAP_NET_ADMIN, so the node agent sets it from a container whose /proc is read-only.
//
// Limits: TCP's CLOSE_WAIT only, in whole seconds. A kernel without cttimeout refuses with
// ErrUnsupported, and the sysctl file is the caller's fallback.
//
// # Tests
//
// As root: a round trip between netlink and the namespace's sysctl, other namespaces untouched.
// Without root: the answer's parser, and which refusals fall back to the sysctl file.
package conntrack

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// From linux/netfilter/nfnetlink_cttimeout.h, which golang.org/x/sys/unix does not carry.
const (
	msgDefaultSet = 3 // IPCTNL_MSG_TIMEOUT_DEFAULT_SET
	msgDefaultGet = 4 // IPCTNL_MSG_TIMEOUT_DEFAULT_GET

	attrL3Proto = 2 // CTA_TIMEOUT_L3PROTO, be16
	attrL4Proto = 3 // CTA_TIMEOUT_L4PROTO, u8
	attrData    = 4 // CTA_TIMEOUT_DATA, nested per protocol

	attrTCPCloseWait = 5 // CTA_TIMEOUT_TCP_CLOSE_WAIT, be32 seconds
)

// ErrUnsupported marks a kernel that refuses conntrack timeouts over netlink.
var ErrUnsupported = errors.New("the kernel offers no conntrack timeouts over netlink")

// timeout bounds one exchange: the kernel answers at once or not at all.
const timeout = 5 * time.Second

// SetCloseWait sets the namespace's TCP CLOSE_WAIT timeout to secs seconds.
func SetCloseWait(secs uint32) error {
	c, err := dial()
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Execute(request(msgDefaultSet, netlink.Acknowledge, &secs)); err != nil {
		return refused(fmt.Errorf("set the conntrack close-wait timeout to %d s: %w", secs, err))
	}
	return nil
}

// CloseWait returns the namespace's TCP CLOSE_WAIT timeout in seconds.
func CloseWait() (uint32, error) {
	c, err := dial()
	if err != nil {
		return 0, err
	}
	defer c.Close()
	if _, err := c.Send(request(msgDefaultGet, 0, nil)); err != nil {
		return 0, refused(fmt.Errorf("ask the conntrack close-wait timeout: %w", err))
	}
	// The kernel flags its answer multi-part and ends it with no "done" message, which
	// mdlayher/netlink's Receive would wait for: the one datagram is read here instead.
	b, err := receive(c)
	if err != nil {
		return 0, fmt.Errorf("read the conntrack close-wait timeout: %w", err)
	}
	v, err := parseCloseWait(b)
	if err != nil {
		return 0, refused(fmt.Errorf("read the conntrack close-wait timeout: %w", err))
	}
	return v, nil
}

func dial() (*netlink.Conn, error) {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return nil, refused(fmt.Errorf("open a netfilter netlink socket: %w", err))
	}
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		c.Close()
		return nil, fmt.Errorf("set the netlink deadline: %w", err)
	}
	return c, nil
}

// request is a cttimeout message about TCP's defaults, setting closeWait when not nil.
func request(typ uint16, flags netlink.HeaderFlags, closeWait *uint32) netlink.Message {
	ae := netlink.NewAttributeEncoder()
	ae.ByteOrder = binary.BigEndian
	// TCP's timeouts serve both families; the kernel asks for a family all the same.
	ae.Uint16(attrL3Proto, unix.AF_INET)
	ae.Uint8(attrL4Proto, unix.IPPROTO_TCP)
	if closeWait != nil {
		ae.Nested(attrData, func(nae *netlink.AttributeEncoder) error {
			nae.Uint32(attrTCPCloseWait, *closeWait)
			return nil
		})
	}
	attrs, _ := ae.Encode() // fixed-size attributes: nothing to fail on
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_CTNETLINK_TIMEOUT<<8 | typ), Flags: netlink.Request | flags},
		// nfgenmsg: family, version, resource id.
		Data: append([]byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}, attrs...),
	}
}

// receive reads one datagram from c.
func receive(c *netlink.Conn) ([]byte, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	b := make([]byte, os.Getpagesize())
	var n int
	var rerr error
	if err := rc.Read(func(fd uintptr) bool {
		n, _, rerr = unix.Recvfrom(int(fd), b, 0)
		return rerr != unix.EAGAIN
	}); err != nil {
		return nil, err
	}
	if rerr != nil {
		return nil, os.NewSyscallError("recvfrom", rerr)
	}
	return b[:n], nil
}

// parseCloseWait reads the CLOSE_WAIT timeout, or the error, from the answer to msgDefaultGet.
func parseCloseWait(b []byte) (uint32, error) {
	msgs, err := syscall.ParseNetlinkMessage(b)
	if err != nil {
		return 0, fmt.Errorf("malformed answer: %w", err)
	}
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		if m.Header.Type == unix.NLMSG_ERROR {
			if code := int32(binary.NativeEndian.Uint32(m.Data)); code < 0 {
				return 0, unix.Errno(-code)
			}
			continue
		}
		ad, err := netlink.NewAttributeDecoder(m.Data[4:])
		if err != nil {
			return 0, fmt.Errorf("malformed answer: %w", err)
		}
		ad.ByteOrder = binary.BigEndian
		var v uint32
		found := false
		for ad.Next() {
			if ad.Type() == attrData {
				ad.Nested(func(nad *netlink.AttributeDecoder) error {
					for nad.Next() {
						if nad.Type() == attrTCPCloseWait {
							v, found = nad.Uint32(), true
						}
					}
					return nil
				})
			}
		}
		if err := ad.Err(); err != nil {
			return 0, fmt.Errorf("malformed answer: %w", err)
		}
		if found {
			return v, nil
		}
	}
	return 0, errors.New("the answer holds no CLOSE_WAIT timeout")
}

// refused marks err ErrUnsupported when it says the kernel lacks what is asked: no netfilter
// netlink (EPROTONOSUPPORT), no cttimeout (EINVAL, nfnetlink's answer for an unknown subsystem:
// it accepts these messages otherwise), or no TCP timeouts (EOPNOTSUPP, ENOENT).
func refused(err error) error {
	for _, e := range []error{unix.EPROTONOSUPPORT, unix.EINVAL, unix.EOPNOTSUPP, unix.ENOENT} {
		if errors.Is(err, e) {
			return fmt.Errorf("%w: %w", ErrUnsupported, err)
		}
	}
	return err
}
