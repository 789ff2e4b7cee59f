package nfnl

// The socket: one NETLINK_NETFILTER socket per call, through mdlayher/netlink, opened in the
// calling thread's network namespace and closed before the call returns, so it is never used in
// a namespace other than the one it was opened in.

import (
	"context"
	"encoding/binary"
	"fmt"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"
)

// source answers requests: the kernel, or, in tests, a recording of it (record_test.go).
type source interface {
	// exchange sends the requests together and returns the answer to each, in order. Only the
	// last may be a dump: the kernel runs one dump at a time per socket.
	exchange(reqs ...request) ([][]netlink.Message, error)
}

// request is one message to the kernel, and the key a recording files its answer under.
type request struct {
	key string
	m   netlink.Message
}

// conn is one netfilter netlink socket.
type conn struct{ nl *netlink.Conn }

func dial(ctx context.Context) (*conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A fixed receive buffer instead of peeking at each datagram's size first (which doubles the
	// system calls): the kernel sends no datagram larger than 32 KiB on this socket.
	nl, err := netlink.Dial(unix.NETLINK_NETFILTER, &netlink.Config{MessageBufferSize: 32 << 10})
	if err != nil {
		return nil, fmt.Errorf("open the nf_tables netlink socket: %w", err)
	}
	// Errors echo only the refused message's header, not the whole message (a rule is 600
	// bytes). (Not with extended acknowledgements too: mdlayher/netlink then misreads a capped
	// error as short.)
	_ = nl.SetOption(netlink.CapAcknowledge, true)
	if d, ok := ctx.Deadline(); ok {
		if err := nl.SetDeadline(d); err != nil {
			nl.Close()
			return nil, fmt.Errorf("set the netlink deadline: %w", err)
		}
	}
	return &conn{nl: nl}, nil
}

func (c *conn) close() { _ = c.nl.Close() }

func (c *conn) exchange(reqs ...request) ([][]netlink.Message, error) {
	msgs := make([]netlink.Message, len(reqs))
	for i, r := range reqs {
		msgs[i] = r.m
	}
	if _, err := c.nl.SendMessages(msgs); err != nil {
		return nil, err
	}
	out := make([][]netlink.Message, len(reqs))
	for i := range reqs {
		// One Receive is one answer: a single message, or every part of a dump up to its end.
		ms, err := c.nl.Receive()
		if err != nil {
			return nil, err
		}
		out[i] = ms
	}
	return out, nil
}

// msg lays out one nf_tables message: the nfgenmsg header, then its attributes, appended into
// the message's one buffer, nested ones closed in place. mdlayher/netlink's AttributeEncoder
// builds every nested level apart and copies it into its parent, a rule's expressions three
// times over: with a thousand rules that was 4 MB and most of the time it took to lay the batch
// out (docs/performance.md). Reading uses its AttributeDecoder.
type msg struct {
	typ   uint16
	flags netlink.HeaderFlags
	b     []byte
}

// newMsg starts a message of the subsystem's message type typ; size is a hint of its length.
func newMsg(typ uint16, flags netlink.HeaderFlags, family byte, size int) *msg {
	m := &msg{typ: typ, flags: flags, b: make([]byte, 4, max(size, 64))}
	m.b[0], m.b[1] = family, unix.NFNETLINK_V0
	return m
}

// message is the netlink message laid out.
func (m *msg) message() netlink.Message {
	return netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | m.typ), Flags: netlink.Request | m.flags},
		Data:   m.b,
	}
}

// attr appends one attribute, padded to 4 bytes.
func (m *msg) attr(typ uint16, data []byte) {
	m.b = binary.NativeEndian.AppendUint16(m.b, uint16(4+len(data)))
	m.b = binary.NativeEndian.AppendUint16(m.b, typ)
	m.b = append(m.b, data...)
	for len(m.b)%4 != 0 {
		m.b = append(m.b, 0)
	}
}

// str appends a NUL-terminated string attribute.
func (m *msg) str(typ uint16, s string) {
	off := m.open(typ)
	m.b = append(append(m.b, s...), 0)
	m.close(off)
}

// u32 and u64 append integers in nf_tables' byte order, big-endian.
func (m *msg) u32(typ uint16, v uint32) { m.attr(typ, binary.BigEndian.AppendUint32(nil, v)) }
func (m *msg) u64(typ uint16, v uint64) { m.attr(typ, binary.BigEndian.AppendUint64(nil, v)) }

// nest opens a nested attribute; close it with close(the returned offset).
func (m *msg) nest(typ uint16) int { return m.open(unix.NLA_F_NESTED | typ) }

func (m *msg) open(typ uint16) int {
	off := len(m.b)
	m.b = binary.NativeEndian.AppendUint16(m.b, 0)
	m.b = binary.NativeEndian.AppendUint16(m.b, typ)
	return off
}

func (m *msg) close(off int) {
	binary.NativeEndian.PutUint16(m.b[off:], uint16(len(m.b)-off))
	for len(m.b)%4 != 0 {
		m.b = append(m.b, 0)
	}
}

// request is a message asking for something: the key a recording files its answer under, and
// the message.
func (m *msg) request(key string) request { return request{key: key, m: m.message()} }

// msgType is an nf_tables message's type within the subsystem.
func msgType(m netlink.Message) uint16 { return uint16(m.Header.Type) & 0xff }

// family is the nfgenmsg family of an nf_tables message.
func family(m netlink.Message) byte {
	if len(m.Data) == 0 {
		return 0
	}
	return m.Data[0]
}

// attrs decodes an nf_tables message's attributes, big-endian as nf_tables sends its integers.
func attrs(m netlink.Message) (*netlink.AttributeDecoder, error) {
	if len(m.Data) < 4 {
		return nil, fmt.Errorf("nf_tables message of %d bytes", len(m.Data))
	}
	return decoder(m.Data[4:])
}

func decoder(b []byte) (*netlink.AttributeDecoder, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	ad.ByteOrder = binary.BigEndian
	return ad, nil
}
