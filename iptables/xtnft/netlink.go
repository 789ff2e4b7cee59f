package xtnft

// The wire: one raw NETLINK_NETFILTER socket per call, opened in the calling thread's network
// namespace. Requests and batches are laid out by hand into one buffer each (the expressions
// too, see wire.go), so a thousand rules cost no allocation per attribute. A batch asks for an
// acknowledgement of its last message only: the kernel processes a batch inside sendmsg and
// queues an error for every message it refuses, in order, before that one answer, so one read
// tells success from failure, where an answer per message would cost a read per rule.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// Sizes of the netlink and nfgenmsg headers.
const (
	nlmsgHdrLen = 16
	nfgenLen    = 4
)

// conn is a raw netfilter netlink socket.
type conn struct {
	fd  int
	buf []byte
}

func dial() (*conn, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, os.NewSyscallError("socket", err)
	}
	// Errors echo only the refused message's header, not the whole message (a rule is ~600 bytes).
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("bind", err)
	}
	// Dump answers are at most 32 KiB per datagram (the kernel caps them there).
	return &conn{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (c *conn) close() { unix.Close(c.fd) }

// send writes b, one or more framed messages, in one sendmsg.
func (c *conn) send(b []byte) error {
	if len(b) > 200<<10 {
		// One sendmsg is capped by the socket's send buffer; grow it for big batches. The forced
		// variant ignores wmem_max and needs CAP_NET_ADMIN, which writing needs anyway.
		if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, len(b)+64<<10); err != nil {
			_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, len(b)+64<<10)
		}
	}
	err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
	return os.NewSyscallError("sendmsg", err)
}

// message is one netlink message received: its header fields and its payload after the
// nfgenmsg header.
type message struct {
	typ    uint16
	seq    uint32
	family byte
	data   []byte
	errno  unix.Errno // for NLMSG_ERROR: the error (0 is an acknowledgement)
}

// recv reads one datagram and splits it into messages. The payloads are copies: the buffer is
// reused by the next read.
func (c *conn) recv() ([]message, error) {
	n, _, err := unix.Recvfrom(c.fd, c.buf, 0)
	if err != nil {
		return nil, os.NewSyscallError("recvmsg", err)
	}
	b := c.buf[:n]
	var out []message
	for len(b) >= nlmsgHdrLen {
		l := int(binary.NativeEndian.Uint32(b))
		if l < nlmsgHdrLen || l > len(b) {
			return nil, fmt.Errorf("malformed netlink message of %d bytes", l)
		}
		m := message{typ: binary.NativeEndian.Uint16(b[4:]), seq: binary.NativeEndian.Uint32(b[8:])}
		body := b[nlmsgHdrLen:l]
		switch {
		case m.typ == unix.NLMSG_ERROR && len(body) >= 4:
			m.errno = unix.Errno(-int32(binary.NativeEndian.Uint32(body)))
		case len(body) >= nfgenLen:
			m.family = body[0]
			m.data = append([]byte(nil), body[nfgenLen:]...)
		}
		out = append(out, m)
		b = b[min(len(b), (l+3)&^3):]
	}
	return out, nil
}

// msgs lays out netlink messages back to back.
type msgs struct {
	b     []byte
	start int
	seq   uint32
	// what says what each message does, by sequence number minus one, for errors.
	what []what
}

// what is what a message does. A rule's is rendered only when the kernel refuses it: rendering
// a thousand rules as text would cost more than laying them out.
type what struct {
	text string
	rule *iptables.XTRule
	fam  byte
	// del is set on deletions, which fail when something else removed the object first.
	del bool
}

func (w what) String() string {
	if w.rule != nil {
		return fmt.Sprintf("add %q to %s %s", w.rule.Rule().String(), famName(w.fam), iptables.Table)
	}
	return w.text
}

// ruleBytes is about what one of our rules takes in a batch (its comment alone is 300 bytes).
const ruleBytes = 640

// grow makes room for n more bytes.
func (m *msgs) grow(n int) {
	if cap(m.b)-len(m.b) < n {
		b := make([]byte, len(m.b), len(m.b)+n)
		copy(b, m.b)
		m.b = b
	}
}

// begin starts a message; attributes follow, and end closes it.
func (m *msgs) begin(typ uint16, flags uint16, family byte) {
	m.start = len(m.b)
	m.seq++
	m.b = binary.NativeEndian.AppendUint32(m.b, 0) // length, set by end
	m.b = binary.NativeEndian.AppendUint16(m.b, typ)
	m.b = binary.NativeEndian.AppendUint16(m.b, flags)
	m.b = binary.NativeEndian.AppendUint32(m.b, m.seq)
	m.b = binary.NativeEndian.AppendUint32(m.b, 0) // port id: the kernel's
	m.b = append(m.b, family, unix.NFNETLINK_V0, 0, 0)
}

// beginNFT starts an nf_tables message.
func (m *msgs) beginNFT(typ uint16, flags uint16, family byte) {
	m.begin(unix.NFNL_SUBSYS_NFTABLES<<8|typ, flags, family)
}

func (m *msgs) end(text string) { m.endWhat(what{text: text}) }

func (m *msgs) endWhat(w what) {
	m.fix()
	m.what = append(m.what, w)
}

// attr appends one attribute, padded to 4 bytes.
func (m *msgs) attr(typ uint16, data []byte) {
	m.b = binary.NativeEndian.AppendUint16(m.b, uint16(4+len(data)))
	m.b = binary.NativeEndian.AppendUint16(m.b, typ)
	m.b = append(m.b, data...)
	m.pad()
}

func (m *msgs) pad() {
	for len(m.b)%4 != 0 {
		m.b = append(m.b, 0)
	}
}

func (m *msgs) str(typ uint16, s string) {
	m.b = binary.NativeEndian.AppendUint16(m.b, uint16(4+len(s)+1))
	m.b = binary.NativeEndian.AppendUint16(m.b, typ)
	m.b = append(m.b, s...)
	m.b = append(m.b, 0)
	m.pad()
}

func (m *msgs) u32(typ uint16, v uint32) {
	m.b = binary.NativeEndian.AppendUint16(m.b, 8)
	m.b = binary.NativeEndian.AppendUint16(m.b, typ)
	m.b = binary.BigEndian.AppendUint32(m.b, v)
}

func (m *msgs) u64(typ uint16, v uint64) {
	m.b = binary.NativeEndian.AppendUint16(m.b, 12)
	m.b = binary.NativeEndian.AppendUint16(m.b, typ)
	m.b = binary.BigEndian.AppendUint64(m.b, v)
}

// nest opens a nested attribute; close it with unnest(the returned offset).
func (m *msgs) nest(typ uint16) int { return m.open(unix.NLA_F_NESTED | typ) }

// open starts an attribute whose content follows; close it with unnest(the returned offset).
func (m *msgs) open(typ uint16) int {
	off := len(m.b)
	m.b = binary.NativeEndian.AppendUint32(m.b, 0)
	binary.NativeEndian.PutUint16(m.b[off+2:], typ)
	return off
}

func (m *msgs) unnest(off int) {
	binary.NativeEndian.PutUint16(m.b[off:], uint16(len(m.b)-off))
}

// dump runs one dump request, already laid out in req with the dump's sequence number seq, and
// returns every message of the answer. Messages with other sequence numbers (answers to requests
// sent in the same sendmsg before the dump) are passed to other.
func (c *conn) dump(req []byte, seq uint32, other func(message) error) ([]message, error) {
	if err := c.send(req); err != nil {
		return nil, err
	}
	var out []message
	for {
		ms, err := c.recv()
		if err != nil {
			return nil, err
		}
		for _, m := range ms {
			if m.seq != seq {
				if err := other(m); err != nil {
					return nil, err
				}
				continue
			}
			switch m.typ {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				return nil, m.errno
			}
			out = append(out, m)
		}
	}
}

// attrs decodes a message's attributes, big-endian as nf_tables sends its integers.
func attrs(b []byte) (*netlink.AttributeDecoder, error) {
	ad, err := netlink.NewAttributeDecoder(b)
	if err != nil {
		return nil, err
	}
	ad.ByteOrder = binary.BigEndian
	return ad, nil
}

// batchError is the kernel refusing a message of a batch. The kernel applied none of the batch.
type batchError struct {
	what string
	del  bool // the refused message was a deletion
	err  unix.Errno
}

func (e *batchError) Error() string {
	return fmt.Sprintf("nf_tables refused to %s; nothing was written: %v", e.what, e.err)
}

func (e *batchError) Unwrap() error { return e.err }

// newBatch starts a transaction that the kernel refuses, with ERESTART, if the ruleset is no
// longer at generation genID. The markers take sequence number 0: answers to them concern the
// whole batch.
func newBatch(genID uint32) *msgs {
	m := &msgs{b: make([]byte, 0, 4096)}
	m.marker(unix.NFNL_MSG_BATCH_BEGIN)
	m.u32(unix.NFNL_BATCH_GENID, genID)
	m.fix()
	m.seq = 0
	return m
}

// marker starts a batch marker message; the nfgenmsg resource id names the subsystem.
func (m *msgs) marker(typ uint16) {
	m.begin(typ, unix.NLM_F_REQUEST, unix.AF_UNSPEC)
	binary.BigEndian.PutUint16(m.b[len(m.b)-2:], unix.NFNL_SUBSYS_NFTABLES)
	binary.NativeEndian.PutUint32(m.b[m.start+8:], 0)
}

// fix sets the length of the message begun last.
func (m *msgs) fix() { binary.NativeEndian.PutUint32(m.b[m.start:], uint32(len(m.b)-m.start)) }

// commit sends the batch m (from newBatch) as one transaction and waits for the verdict. A
// batch with no message sends nothing.
func (c *conn) commit(m *msgs) error {
	if m.seq == 0 {
		return nil
	}
	// The acknowledgement of the last message is the sign that the kernel is done.
	binary.NativeEndian.PutUint16(m.b[m.start+6:], binary.NativeEndian.Uint16(m.b[m.start+6:])|unix.NLM_F_ACK)
	last := m.seq
	m.marker(unix.NFNL_MSG_BATCH_END)
	m.fix()
	if err := c.send(m.b); err != nil {
		return err
	}
	var first error
	for {
		ms, err := c.recv()
		if err != nil {
			return errors.Join(first, err)
		}
		for _, a := range ms {
			if a.typ != unix.NLMSG_ERROR {
				continue
			}
			if a.errno != 0 && first == nil {
				be := &batchError{what: "apply the batch", err: a.errno}
				if a.seq >= 1 && int(a.seq) <= len(m.what) {
					be.what, be.del = m.what[a.seq-1].String(), m.what[a.seq-1].del
				}
				first = be
			}
			// The answer to the last message ends it; so does one to a marker, which concerns
			// the whole batch (a changed generation, a missing permission).
			if a.seq == last || a.seq == 0 {
				return first
			}
		}
	}
}
