package nfnl

// The socket (see the package comment): opened and closed within one call, so it is never used
// in a namespace other than the one it was opened in.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// source answers requests: the kernel, or, in tests, a recording of it (record_test.go).
type source interface {
	// exchange sends the requests together and returns the answer to each, in order. Only the
	// last may be a dump: the kernel runs one dump at a time per socket.
	exchange(reqs ...request) ([][]netlink.Message, error)
}

// request is one message asking the kernel for something, and the key a recording files its
// answer under.
type request struct {
	key   string
	typ   uint16
	flags netlink.HeaderFlags
	fam   byte
	// name, when set, is the one attribute: a table's name (typ NFTA_*_TABLE), and set the
	// set's (NFTA_SET_ELEM_LIST_SET).
	name, set string
}

// conn is one netfilter netlink socket.
type conn struct{ nl *netlink.Conn }

func dial(ctx context.Context) (*conn, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A fixed receive buffer instead of peeking at each datagram's size first (which doubles the
	// system calls): the kernel sends no datagram larger than 32 KiB on this socket.
	nl, err := dialNetlink(unix.NETLINK_NETFILTER, &netlink.Config{MessageBufferSize: 32 << 10})
	if errors.Is(err, unix.EPROTONOSUPPORT) || errors.Is(err, unix.EAFNOSUPPORT) {
		// Refused at the socket itself, before any message: no nf_tables here at all.
		return nil, fmt.Errorf("open the nf_tables netlink socket: %w: %w", iptables.ErrNotInKernel, err)
	}
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

// dialNetlink opens the socket; a test replaces it to stand in for a kernel or sandbox that
// refuses NETLINK_NETFILTER.
var dialNetlink = netlink.Dial

func (c *conn) close() { _ = c.nl.Close() }

func (c *conn) exchange(reqs ...request) ([][]netlink.Message, error) {
	var w wbuf
	for _, r := range reqs {
		w.begin(r.typ, r.flags, r.fam)
		if r.name != "" { // NFTA_SET_TABLE and NFTA_SET_ELEM_LIST_TABLE are NFTA_RULE_TABLE's number
			w.str(unix.NFTA_RULE_TABLE, r.name)
		}
		if r.set != "" {
			w.str(unix.NFTA_SET_ELEM_LIST_SET, r.set)
		}
		w.end()
	}
	if err := c.send(w.b); err != nil {
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

// send writes b, messages laid out back to back, in one sendmsg on mdlayher/netlink's socket.
// Its own SendMessages copies every message twice over on the way (per message, then into a
// growing buffer): with a thousand rules that was 3 MB, and a fresh process pays for every page it
// touches (docs/performance.md).
func (c *conn) send(b []byte) error {
	if len(b) > 200<<10 {
		// One sendmsg is capped by the socket's send buffer, and a batch is one sendmsg.
		_ = c.nl.SetWriteBuffer(len(b) + 64<<10)
	}
	rc, err := c.nl.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Write(func(fd uintptr) bool {
		serr = unix.Sendto(int(fd), b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		return serr != unix.EAGAIN
	}); err != nil {
		return err
	}
	return os.NewSyscallError("sendmsg", serr)
}

// wbuf lays netlink messages out back to back in one buffer, nested attributes closed in place.
// mdlayher/netlink's AttributeEncoder builds every nested level apart and copies it into its
// parent, a rule's expressions three times over: with a thousand rules that was 4 MB and most of
// the time it took to lay a batch out.
type wbuf struct {
	b     []byte
	start int // of the message begun last
	seq   uint32
}

// begin starts an nf_tables message of the subsystem's message type typ.
func (w *wbuf) begin(typ uint16, flags netlink.HeaderFlags, family byte) {
	w.header(unix.NFNL_SUBSYS_NFTABLES<<8|typ, flags)
	w.b = append(w.b, family, unix.NFNETLINK_V0, 0, 0)
}

// beginIn begins a message about the object name (attribute attr) of table, which is attribute
// 1 of chains, rules, sets and element lists alike (NFTA_*_TABLE).
func (w *wbuf) beginIn(typ uint16, fl netlink.HeaderFlags, fam byte, table string, attr uint16, name string) {
	w.begin(typ, fl, fam)
	w.str(unix.NFTA_RULE_TABLE, table)
	w.str(attr, name)
}

// header starts a message with its netlink header: the length is set by end, the port id is the
// kernel's to fill in, and sequence numbers count from 1.
func (w *wbuf) header(typ uint16, flags netlink.HeaderFlags) {
	w.start = len(w.b)
	w.seq++
	w.b = binary.NativeEndian.AppendUint32(w.b, 0)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	w.b = binary.NativeEndian.AppendUint16(w.b, uint16(netlink.Request|flags))
	w.b = binary.NativeEndian.AppendUint32(w.b, w.seq)
	w.b = binary.NativeEndian.AppendUint32(w.b, 0)
}

// end sets the length of the message begun last.
func (w *wbuf) end() { binary.NativeEndian.PutUint32(w.b[w.start:], uint32(len(w.b)-w.start)) }

// attr appends one attribute, padded to 4 bytes.
func (w *wbuf) attr(typ uint16, data []byte) {
	off := w.open(typ)
	w.b = append(w.b, data...)
	w.close(off)
}

// str appends a NUL-terminated string attribute.
func (w *wbuf) str(typ uint16, s string) {
	off := w.open(typ)
	w.b = append(append(w.b, s...), 0)
	w.close(off)
}

// u32 appends an integer in nf_tables' byte order, big-endian.
func (w *wbuf) u32(typ uint16, v uint32) {
	off := w.open(typ)
	w.b = binary.BigEndian.AppendUint32(w.b, v)
	w.close(off)
}

// nest opens a nested attribute; close it with close(the returned offset).
func (w *wbuf) nest(typ uint16) int { return w.open(unix.NLA_F_NESTED | typ) }

func (w *wbuf) open(typ uint16) int {
	off := len(w.b)
	w.b = binary.NativeEndian.AppendUint16(w.b, 0)
	w.b = binary.NativeEndian.AppendUint16(w.b, typ)
	return off
}

func (w *wbuf) close(off int) {
	binary.NativeEndian.PutUint16(w.b[off:], uint16(len(w.b)-off))
	for len(w.b)%4 != 0 {
		w.b = append(w.b, 0)
	}
}

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
	if err == nil {
		ad.ByteOrder = binary.BigEndian
	}
	return ad, err
}

// eachMsgAttr calls f on each attribute of an nf_tables message, and eachAttr on each of b.
func eachMsgAttr(m netlink.Message, f func(ad *netlink.AttributeDecoder)) error {
	ad, err := attrs(m)
	return each(ad, err, f)
}

func eachAttr(b []byte, f func(ad *netlink.AttributeDecoder)) error {
	ad, err := decoder(b)
	return each(ad, err, f)
}

func each(ad *netlink.AttributeDecoder, err error, f func(ad *netlink.AttributeDecoder)) error {
	if err != nil {
		return err
	}
	for ad.Next() {
		f(ad)
	}
	return ad.Err()
}

// nested calls f on each attribute nested in ad's current one.
func nested(ad *netlink.AttributeDecoder, f func(nd *netlink.AttributeDecoder)) {
	ad.Nested(func(nd *netlink.AttributeDecoder) error {
		for nd.Next() {
			f(nd)
		}
		return nil
	})
}
