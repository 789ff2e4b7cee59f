package nfnl

// The batch (see the package comment). Only its last message asks for an answer: the kernel
// processes a batch inside sendmsg and queues, in order, an error for every message it refuses
// and then the answer to the last one, so one answer tells success from failure, where an answer
// per message would cost a read per rule.

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// Batch is one nf_tables transaction, built by the planner from a State: its messages laid out
// in one buffer behind the begin marker, and what each does.
type Batch struct {
	wbuf
	gen uint32
	// unread says why the state the batch was planned from is not the kernel's ("" when it is).
	unread string
	what   []what
	last   int // where the last message starts
	setID  uint32
	err    error
	// scratch holds the expressions of the rule being laid out, pool those of them it owns.
	scratch []expr.Any
	pool    exprPool
}

// what says what one message does. Anything but a fixed text is rendered only when asked for
// (an error, --simulate): rendering a thousand rules as text costs more than laying them out,
// and even a few cost a fresh process the pages of the code that renders them.
type what struct {
	text   string
	render func() string
	xt     *iptables.XTRule
	fam    byte
	// set and from, to: the elements of intervals [from, to) of a set.
	set      *iptables.NFTSet
	from, to int
	// del is set on deletions, which fail when something else removed the object first.
	del bool
}

func (w what) String() string {
	if w.render != nil {
		return w.render()
	}
	if w.xt != nil {
		r := w.xt.Rule()
		return strings.TrimRight(fmt.Sprintf("add rule %s %s %s %s", famName[w.fam], w.xt.TableName(), r.Chain, r.Spec), " ")
	}
	if w.set != nil {
		part := *w.set
		part.Elements = part.Elements[w.from:w.to]
		return fmt.Sprintf("add element inet %s %s { %s }", iptables.NFTTableName, part.Name, strings.Join(part.ElementStrings(), ", "))
	}
	return w.text
}

// newBatch starts a batch planned from s: its begin marker carries the generation s was read at,
// so the kernel refuses the batch whole if the ruleset is no longer at it. Messages follow, each
// begun with begin, then its attributes, then add.
func newBatch(s *State) *Batch {
	b := &Batch{gen: s.gen, unread: s.unread}
	b.marker(unix.NFNL_MSG_BATCH_BEGIN)
	b.u32(unix.NFNL_BATCH_GENID, s.gen)
	b.end()
	return b
}

// marker starts a batch marker message; the nfgenmsg resource id names the subsystem.
func (b *Batch) marker(typ uint16) {
	b.header(typ, 0)
	b.b = append(b.b, unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, unix.NFNL_SUBSYS_NFTABLES)
}

// Len is the number of messages, batch markers left out.
func (b *Batch) Len() int { return len(b.what) }

// grow makes room for n more messages of about size bytes in all. The buffer is made, not grown
// with slices.Grow, which zeroes the room it adds, touching every page of it at once: a large
// make gets pages the kernel has zeroed, touched and paid for only as messages fill them.
func (b *Batch) grow(n, size int) {
	b.what = slices.Grow(b.what, n)
	if cap(b.b)-len(b.b) < size {
		buf := make([]byte, len(b.b), len(b.b)+size)
		copy(buf, b.b)
		b.b = buf
	}
}

// add ends the message begun last, and records what it does.
func (b *Batch) add(w what) {
	b.end()
	b.what = append(b.what, w)
	b.last = b.start
}

// fail records the batch's first error.
func (b *Batch) fail(err error) { b.err = cmp.Or(b.err, err) }

// String prints the transaction: a comment line saying what it was planned from, then every
// message, one a line, in the order the kernel applies them.
func (b *Batch) String() string {
	var s strings.Builder
	from := "planned at ruleset generation " + strconv.FormatUint(uint64(b.gen), 10)
	if b.unread != "" {
		from = "planned for a namespace holding no nf_tables tables (the kernel state was not read: " + b.unread + ")"
	}
	if len(b.what) == 0 {
		return fmt.Sprintf("# nf_tables: nothing to send, %s: the rules in place are already these\n", from)
	}
	fmt.Fprintf(&s, "# nf_tables transaction %s: %d messages, applied all together or not at all\n", from, len(b.what))
	for _, w := range b.what {
		s.WriteString(w.String())
		s.WriteByte('\n')
	}
	return s.String()
}

// commit sends the batch as one transaction and waits for the kernel's verdict. An empty batch
// sends nothing.
func (c *conn) commit(b *Batch) error {
	if b.err != nil {
		return b.err
	}
	if len(b.what) == 0 {
		return nil
	}
	b.ackLast()
	b.marker(unix.NFNL_MSG_BATCH_END)
	b.end()
	if err := c.send(b.b); err != nil {
		return fmt.Errorf("send the nf_tables batch: %w", err)
	}
	var refused error
	err := c.answers(len(b.what), func(oe *netlink.OpError) bool {
		be := &BatchError{What: "apply the batch", Count: len(b.what), Err: oe.Err}
		if i := int(oe.Sequence) - firstSeq; oe.Sequence >= firstSeq && i < len(b.what) {
			be.What, be.Index, be.del = b.what[i].String(), i+1, b.what[i].del
		}
		if refused == nil {
			refused = be
		}
		// An answer to the begin marker concerns the whole batch (a changed generation, a
		// missing permission) and is the only one.
		return oe.Sequence == firstSeq-1
	})
	if err != nil {
		return errors.Join(refused, err)
	}
	return refused
}

// firstSeq is the sequence number of a batch's first message, after its begin marker's.
const firstSeq = 2

// ackLast asks for an answer to the last message: the sign that the kernel is done.
func (b *Batch) ackLast() {
	flags := b.b[b.last+6:]
	binary.NativeEndian.PutUint16(flags, binary.NativeEndian.Uint16(flags)|uint16(netlink.Acknowledge))
}

// answers reads the kernel's answers to a batch of n messages, handing each refusal to refused,
// until the answer to the last message or until refused returns true.
func (c *conn) answers(n int, refused func(oe *netlink.OpError) bool) error {
	last := uint32(firstSeq + n - 1)
	for {
		ms, err := c.nl.Receive()
		var oe *netlink.OpError
		switch {
		case err == nil:
			if slices.ContainsFunc(ms, func(m netlink.Message) bool {
				return m.Header.Type == netlink.Error && m.Header.Sequence == last
			}) {
				return nil
			}
		case !errors.As(err, &oe) || oe.Sequence == 0:
			return err
		case refused(oe) || oe.Sequence == last:
			return nil
		}
	}
}

// BatchError is the kernel refusing a message of a batch, or the whole batch. The kernel applied
// none of it.
type BatchError struct {
	// What is the refused message as Batch.String prints it, or "apply the batch".
	What string
	// Index is the refused message's place in the batch, from 1 (0: the batch as a whole), of
	// Count messages.
	Index, Count int
	Err          error
	del          bool
}

func (e *BatchError) Error() string {
	where := ""
	if e.Index > 0 {
		where = fmt.Sprintf(" (message %d of %d)", e.Index, e.Count)
	}
	return fmt.Sprintf("nf_tables refused to %s%s; nothing was written: %v", e.What, where, e.Err)
}

func (e *BatchError) Unwrap() error { return e.Err }

// stale reports whether err is the kernel refusing a batch planned from a state that no longer
// holds: the generation moved (ERESTART), or, on a kernel without generation checks, an object
// a deletion names vanished or gained a user (ENOENT, EBUSY). (ENOENT on an addition is a
// kernel without an expression or extension: planning again cannot help.)
func stale(err error) bool {
	var be *BatchError
	if !errors.As(err, &be) {
		return false
	}
	return errors.Is(be.Err, unix.ERESTART) || be.del && (errors.Is(be.Err, unix.ENOENT) || errors.Is(be.Err, unix.EBUSY))
}
