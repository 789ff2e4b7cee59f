package xtnft

// The expressions on the wire: a sink that lays a rule's expressions straight into the batch.
// A thousand rules hold ten thousand expressions, and building google/nftables expressions
// first, then marshalling each, cost several allocations per attribute; this writes the same
// bytes (TestWireMatchesMarshal holds them equal to expr.Marshal of exprSink's expressions).

import (
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// zeros pads an xtables info struct: the longest, the comment's, is commentLen.
var zeros [commentLen]byte

// wire appends a rule's expressions to a batch message whose expression list is open.
type wire struct{ m *msgs }

var _ sink = wire{}

// elem opens one expression: a list element holding its name and its data; close both with
// done.
func (w wire) elem(name string) (el, data int) {
	el = w.m.nest(unix.NFTA_LIST_ELEM)
	w.m.str(unix.NFTA_EXPR_NAME, name)
	return el, w.m.nest(unix.NFTA_EXPR_DATA)
}

func (w wire) done(el, data int) {
	w.m.unnest(data)
	w.m.unnest(el)
}

// value appends a nested NFTA_DATA_VALUE.
func (w wire) value(typ uint16, v []byte) {
	n := w.m.nest(typ)
	w.m.attr(unix.NFTA_DATA_VALUE, v)
	w.m.unnest(n)
}

func (w wire) meta(key expr.MetaKey) {
	el, d := w.elem("meta")
	w.m.u32(unix.NFTA_META_KEY, uint32(key))
	w.m.u32(unix.NFTA_META_DREG, reg1)
	w.done(el, d)
}

func (w wire) cmp(data []byte) {
	el, d := w.elem("cmp")
	w.m.u32(unix.NFTA_CMP_SREG, reg1)
	w.m.u32(unix.NFTA_CMP_OP, uint32(expr.CmpOpEq))
	w.value(unix.NFTA_CMP_DATA, data)
	w.done(el, d)
}

func (w wire) payload(base expr.PayloadBase, off, n uint32) {
	el, d := w.elem("payload")
	w.m.u32(unix.NFTA_PAYLOAD_DREG, reg1)
	w.m.u32(unix.NFTA_PAYLOAD_BASE, uint32(base))
	w.m.u32(unix.NFTA_PAYLOAD_OFFSET, off)
	w.m.u32(unix.NFTA_PAYLOAD_LEN, n)
	w.done(el, d)
}

func (w wire) mask(mask []byte) {
	el, d := w.elem("bitwise")
	w.m.u32(unix.NFTA_BITWISE_SREG, reg1)
	w.m.u32(unix.NFTA_BITWISE_DREG, reg1)
	w.m.u32(unix.NFTA_BITWISE_LEN, uint32(len(mask)))
	w.value(unix.NFTA_BITWISE_MASK, mask)
	var zero [16]byte
	w.value(unix.NFTA_BITWISE_XOR, zero[:len(mask)])
	w.done(el, d)
}

func (w wire) between(from, to []byte) {
	el, d := w.elem("range")
	w.m.u32(unix.NFTA_RANGE_SREG, reg1)
	w.m.u32(unix.NFTA_RANGE_OP, uint32(expr.CmpOpEq))
	w.value(unix.NFTA_RANGE_FROM_DATA, from)
	w.value(unix.NFTA_RANGE_TO_DATA, to)
	w.done(el, d)
}

func (w wire) xt(target bool, name string, rev uint32, info []byte) {
	el, d, in := w.xtOpen(target, name, rev)
	w.m.b = append(w.m.b, info...)
	w.xtClose(el, d, in, len(info))
}

func (w wire) comment(text string) {
	el, d, in := w.xtOpen(false, "comment", commentRev)
	w.m.b = append(w.m.b, text...)
	w.xtClose(el, d, in, commentLen)
}

// xtOpen begins an xtables match or target; its info follows, and xtClose ends it, padding the
// info with zeros to size bytes.
func (w wire) xtOpen(target bool, name string, rev uint32) (el, d, info int) {
	kind, nameAttr, revAttr, infoAttr := "match", uint16(unix.NFTA_MATCH_NAME), uint16(unix.NFTA_MATCH_REV), uint16(unix.NFTA_MATCH_INFO)
	if target {
		kind, nameAttr, revAttr, infoAttr = "target", unix.NFTA_TARGET_NAME, unix.NFTA_TARGET_REV, unix.NFTA_TARGET_INFO
	}
	el, d = w.elem(kind)
	w.m.str(nameAttr, name)
	w.m.u32(revAttr, rev)
	return el, d, w.m.open(infoAttr)
}

func (w wire) xtClose(el, d, info, size int) {
	if n := size - (len(w.m.b) - info - 4); n > 0 {
		w.m.b = append(w.m.b, zeros[:n]...)
	}
	w.m.unnest(info)
	w.m.pad()
	w.done(el, d)
}

func (w wire) counter() {
	el, d := w.elem("counter")
	w.m.u64(unix.NFTA_COUNTER_BYTES, 0)
	w.m.u64(unix.NFTA_COUNTER_PACKETS, 0)
	w.done(el, d)
}

func (w wire) verdict(kind expr.VerdictKind, chain string) {
	el, d := w.elem("immediate")
	w.m.u32(unix.NFTA_IMMEDIATE_DREG, unix.NFT_REG_VERDICT)
	im := w.m.nest(unix.NFTA_IMMEDIATE_DATA)
	v := w.m.nest(unix.NFTA_DATA_VERDICT)
	w.m.u32(unix.NFTA_VERDICT_CODE, uint32(kind))
	if chain != "" {
		w.m.str(unix.NFTA_VERDICT_CHAIN, chain)
	}
	w.m.unnest(v)
	w.m.unnest(im)
	w.done(el, d)
}
