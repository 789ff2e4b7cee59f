package nftables

// The write side: an nftables transaction built as raw netlink messages and sent in one
// sendmsg. google/nftables marshals the rule expressions; the messages around them are built
// here because its Conn cannot record table user data (the plan comment) and because owning the
// batch lets an error name the exact object the kernel refused.

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// Attributes and values that golang.org/x/sys/unix does not define.
const (
	nftaTableHandle   = 4 // NFTA_TABLE_HANDLE
	nftaTableUserdata = 6 // NFTA_TABLE_USERDATA
	udataTableComment = 0 // NFTNL_UDATA_TABLE_COMMENT
	// Set key types, as nft numbers its datatypes.
	typeIPv4Addr    = 7
	typeIPv6Addr    = 8
	typeInetService = 13
	// maxElemBytes keeps one NEWSETELEM's element list well under the 64 KiB limit of a netlink
	// attribute; larger sets are split over several messages of the same transaction.
	maxElemBytes = 48 << 10
)

// batch is one nftables transaction under construction.
type batch struct {
	msgs  []netlink.Message
	desc  []string // what each message does, for errors
	setID uint32
	err   error
}

func (b *batch) add(typ uint16, flags netlink.HeaderFlags, family byte, attrs []netlink.Attribute, desc string) {
	data, err := netlink.MarshalAttributes(attrs)
	if err != nil {
		if b.err == nil {
			b.err = fmt.Errorf("marshal %s: %w", desc, err)
		}
		return
	}
	b.msgs = append(b.msgs, netlink.Message{
		Header: netlink.Header{
			Type:  netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | typ),
			Flags: netlink.Request | netlink.Acknowledge | flags,
		},
		Data: append(nfgen(family, 0), data...),
	})
	b.desc = append(b.desc, desc)
}

// nfgen is the nfgenmsg header every nfnetlink message starts with.
func nfgen(family byte, resID uint16) []byte {
	return []byte{family, unix.NFNETLINK_V0, byte(resID >> 8), byte(resID)}
}

func cstr(s string) []byte { return append([]byte(s), 0) }

func u32(v uint32) []byte { return binaryutil.BigEndian.PutUint32(v) }

func u64(v uint64) []byte { return binaryutil.BigEndian.PutUint64(v) }

func nested(typ uint16, attrs []netlink.Attribute) (netlink.Attribute, error) {
	data, err := netlink.MarshalAttributes(attrs)
	return netlink.Attribute{Type: unix.NLA_F_NESTED | typ, Data: data}, err
}

const inet = unix.NFPROTO_INET

// replaceTable adds the messages that replace our table with t: create it if missing (so the
// delete cannot fail), delete it, and create it anew with its sets, chains and rules. The
// kernel applies all of it, or none, at the end of the batch.
func (b *batch) replaceTable(t iptables.NFTTable) {
	name := []netlink.Attribute{{Type: unix.NFTA_TABLE_NAME, Data: cstr(iptables.NFTTableName)}}
	b.add(unix.NFT_MSG_NEWTABLE, netlink.Create, inet, name, "ensure table exists")
	b.add(unix.NFT_MSG_DELTABLE, 0, inet, name, "delete old table")
	b.addTable(iptables.NFTTableName, t)
}

// addTable adds the messages that create t under the given name; the table must not exist at
// that point of the batch.
func (b *batch) addTable(name string, t iptables.NFTTable) {
	tbl := cstr(name)
	b.add(unix.NFT_MSG_NEWTABLE, netlink.Create, inet, []netlink.Attribute{
		{Type: unix.NFTA_TABLE_NAME, Data: tbl},
		{Type: unix.NFTA_TABLE_FLAGS, Data: u32(0)},
		{Type: nftaTableUserdata, Data: userdata.AppendString(nil, udataTableComment, t.Comment)},
	}, "add table "+name)

	setIDs := map[string]uint32{}
	for _, s := range t.Sets {
		b.setID++
		setIDs[s.Name] = b.setID
		b.addSet(tbl, s, b.setID)
	}
	for _, c := range t.Chains {
		hook, err := nested(unix.NFTA_CHAIN_HOOK, []netlink.Attribute{
			{Type: unix.NFTA_HOOK_HOOKNUM, Data: u32(c.Hook.Number)},
			{Type: unix.NFTA_HOOK_PRIORITY, Data: u32(uint32(int32(c.Priority)))},
		})
		b.fail(err)
		b.add(unix.NFT_MSG_NEWCHAIN, netlink.Create, inet, []netlink.Attribute{
			{Type: unix.NFTA_CHAIN_TABLE, Data: tbl},
			{Type: unix.NFTA_CHAIN_NAME, Data: cstr(c.Name)},
			hook,
			{Type: unix.NFTA_CHAIN_POLICY, Data: u32(1)}, // NF_ACCEPT,
			{Type: unix.NFTA_CHAIN_TYPE, Data: cstr("nat")},
		}, "add chain "+c.Name)
		for _, r := range c.Rules {
			exprs, err := ruleExprs(r, setIDs)
			if err != nil {
				b.fail(fmt.Errorf("chain %s: rule %q: %w", c.Name, r, err))
				return
			}
			var list []netlink.Attribute
			for _, e := range exprs {
				data, err := expr.Marshal(inet, e)
				b.fail(err)
				list = append(list, netlink.Attribute{Type: unix.NLA_F_NESTED | unix.NFTA_LIST_ELEM, Data: data})
			}
			el, err := nested(unix.NFTA_RULE_EXPRESSIONS, list)
			b.fail(err)
			attrs := []netlink.Attribute{
				{Type: unix.NFTA_RULE_TABLE, Data: tbl},
				{Type: unix.NFTA_RULE_CHAIN, Data: cstr(c.Name)},
				el,
			}
			if r.Comment != "" {
				attrs = append(attrs, netlink.Attribute{Type: unix.NFTA_RULE_USERDATA, Data: userdata.AppendString(nil, userdata.TypeComment, r.Comment)})
			}
			b.add(unix.NFT_MSG_NEWRULE, netlink.Create|netlink.Append, inet, attrs, "add rule "+c.Name+" "+r.String())
		}
	}
}

func (b *batch) fail(err error) {
	if err != nil && b.err == nil {
		b.err = err
	}
}

// addSet adds a constant interval set and its elements (see intervalElements).
func (b *batch) addSet(tbl []byte, s iptables.NFTSet, id uint32) {
	keyType := map[iptables.NFTSetType]uint32{iptables.NFTPorts: typeInetService, iptables.NFTIPv4: typeIPv4Addr, iptables.NFTIPv6: typeIPv6Addr}[s.Type]
	keyLen := s.Type.KeyLen()
	if keyType == 0 || keyLen == 0 {
		b.fail(fmt.Errorf("set %s: unknown type %q", s.Name, s.Type))
		return
	}
	for i, iv := range s.Elements {
		if len(iv.First) != keyLen || len(iv.Last) != keyLen {
			b.fail(fmt.Errorf("set %s: element %d has the wrong key length", s.Name, i))
			return
		}
	}
	elems := intervalElements(s.Elements, keyLen)
	desc, err := nested(unix.NFTA_SET_DESC, []netlink.Attribute{{Type: unix.NFTA_SET_DESC_SIZE, Data: u32(uint32(len(elems)))}})
	b.fail(err)
	b.add(unix.NFT_MSG_NEWSET, netlink.Create, inet, []netlink.Attribute{
		{Type: unix.NFTA_SET_TABLE, Data: tbl},
		{Type: unix.NFTA_SET_NAME, Data: cstr(s.Name)},
		{Type: unix.NFTA_SET_FLAGS, Data: u32(unix.NFT_SET_CONSTANT | unix.NFT_SET_INTERVAL)},
		{Type: unix.NFTA_SET_KEY_TYPE, Data: u32(keyType)},
		{Type: unix.NFTA_SET_KEY_LEN, Data: u32(uint32(keyLen))},
		{Type: unix.NFTA_SET_ID, Data: u32(id)},
		desc,
		// Key byte order "big endian", as nft records it, so `nft list` prints the keys.
		{Type: unix.NFTA_SET_USERDATA, Data: userdata.AppendUint32(nil, userdata.NFTNL_UDATA_SET_KEYBYTEORDER, 2)},
	}, "add set "+s.Name)

	for len(elems) > 0 {
		// Elements are the bulk of a big table: they are laid out by hand into one buffer per
		// message instead of one allocation per attribute.
		list := make([]byte, 0, min(len(elems)*elemSize(keyLen), maxElemBytes+64))
		for len(elems) > 0 && len(list) < maxElemBytes {
			list = appendElem(list, elems[0])
			elems = elems[1:]
		}
		b.add(unix.NFT_MSG_NEWSETELEM, netlink.Create, inet, []netlink.Attribute{
			{Type: unix.NFTA_SET_ELEM_LIST_TABLE, Data: tbl},
			{Type: unix.NFTA_SET_ELEM_LIST_SET, Data: cstr(s.Name)},
			{Type: unix.NFTA_SET_ELEM_LIST_SET_ID, Data: u32(id)},
			{Type: unix.NLA_F_NESTED | unix.NFTA_SET_ELEM_LIST_ELEMENTS, Data: list},
		}, "add elements to set "+s.Name)
	}
}

// align4 rounds n up to the netlink attribute alignment.
func align4(n int) int { return (n + 3) &^ 3 }

// elemSize is the encoded size of one set element with its interval-end flag.
func elemSize(keyLen int) int { return 4 + 4 + 4 + align4(keyLen) + 8 }

// appendAttrHeader appends a netlink attribute header (native byte order) for a payload of n
// bytes.
func appendAttrHeader(b []byte, typ uint16, n int) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+n))
	return binary.NativeEndian.AppendUint16(b, typ)
}

// appendElem appends one NFTA_LIST_ELEM: the key, nested twice, and the interval-end flag.
func appendElem(b []byte, e nftables.SetElement) []byte {
	value := 4 + align4(len(e.Key)) // NFTA_DATA_VALUE
	key := 4 + value                // NFTA_SET_ELEM_KEY
	size := key
	if e.IntervalEnd {
		size += 8 // NFTA_SET_ELEM_FLAGS
	}
	b = appendAttrHeader(b, unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, size)
	b = appendAttrHeader(b, unix.NLA_F_NESTED|unix.NFTA_SET_ELEM_KEY, value)
	b = appendAttrHeader(b, unix.NFTA_DATA_VALUE, len(e.Key))
	b = append(b, e.Key...)
	for range align4(len(e.Key)) - len(e.Key) {
		b = append(b, 0)
	}
	if e.IntervalEnd {
		b = appendAttrHeader(b, unix.NFTA_SET_ELEM_FLAGS, 4)
		b = binary.BigEndian.AppendUint32(b, unix.NFT_SET_ELEM_INTERVAL_END)
	}
	return b
}

// intervalElements lays intervals out as interval set elements, the way nft does: each
// interval as its first key and, flagged as an interval end, the key after its last (none when
// it runs to the top of the key space); plus a leading end marker at zero when the first
// interval starts above zero.
func intervalElements(ivs []iptables.NFTInterval, keyLen int) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, 2*len(ivs)+1)
	for i, iv := range ivs {
		if i == 0 && !isZero(iv.First) {
			out = append(out, nftables.SetElement{Key: make([]byte, keyLen), IntervalEnd: true})
		}
		out = append(out, nftables.SetElement{Key: iv.First})
		if next, overflow := iptables.Increment(iv.Last); !overflow {
			out = append(out, nftables.SetElement{Key: next, IntervalEnd: true})
		}
	}
	return out
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// ruleExprs translates a rule of the model into expressions, exactly as nft compiles the same
// statement (including the protocol dependencies nft adds).
func ruleExprs(r iptables.NFTRule, setIDs map[string]uint32) ([]expr.Any, error) {
	var out []expr.Any
	cmp := func(key expr.MetaKey, data []byte) {
		out = append(out, &expr.Meta{Key: key, Register: 1}, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: data})
	}
	lookup := func(set string) error {
		id, ok := setIDs[set]
		if !ok {
			return fmt.Errorf("set %q is not in the table", set)
		}
		out = append(out, &expr.Lookup{SourceRegister: 1, SetName: set, SetID: id})
		return nil
	}
	for _, m := range r.Matches {
		switch m.Kind {
		case iptables.NFTMatchNFProto:
			cmp(expr.MetaKeyNFPROTO, []byte{nfproto(m.Family)})
		case iptables.NFTMatchTCP:
			cmp(expr.MetaKeyL4PROTO, []byte{unix.IPPROTO_TCP})
		case iptables.NFTMatchDPortSet:
			cmp(expr.MetaKeyL4PROTO, []byte{unix.IPPROTO_TCP})
			out = append(out, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2})
			if err := lookup(m.Set); err != nil {
				return nil, err
			}
		case iptables.NFTMatchSAddrSet, iptables.NFTMatchDAddrSet:
			cmp(expr.MetaKeyNFPROTO, []byte{nfproto(m.Family)})
			off, ln := iptables.AddrOffset(m.Family, m.Kind == iptables.NFTMatchSAddrSet)
			out = append(out, &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: ln})
			if err := lookup(m.Set); err != nil {
				return nil, err
			}
		case iptables.NFTMatchSkUID:
			cmp(expr.MetaKeySKUID, binaryutil.NativeEndian.PutUint32(m.ID))
		case iptables.NFTMatchSkGID:
			cmp(expr.MetaKeySKGID, binaryutil.NativeEndian.PutUint32(m.ID))
		case iptables.NFTMatchOIFName:
			if len(m.Name) >= unix.IFNAMSIZ {
				return nil, fmt.Errorf("interface name %q too long", m.Name)
			}
			name := make([]byte, unix.IFNAMSIZ)
			copy(name, m.Name)
			cmp(expr.MetaKeyOIFNAME, name)
		default:
			return nil, fmt.Errorf("match %s cannot be written", m)
		}
	}
	switch {
	case r.Verdict == iptables.NFTReturn:
		out = append(out, &expr.Verdict{Kind: expr.VerdictReturn})
	case r.Verdict == iptables.NFTRedirect && r.RedirectPort != 0:
		port := make([]byte, 2)
		binary.BigEndian.PutUint16(port, r.RedirectPort)
		out = append(out, &expr.Immediate{Register: 1, Data: port}, &expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED})
	case r.Verdict == iptables.NFTRedirect:
		return nil, errors.New("redirect to port 0")
	default:
		return nil, fmt.Errorf("unknown verdict %d", r.Verdict)
	}
	return out, nil
}

func nfproto(f iptables.Family) byte {
	if f == iptables.IPv6 {
		return unix.NFPROTO_IPV6
	}
	return unix.NFPROTO_IPV4
}

// send runs the batch as one transaction and waits for the kernel's verdict on every message.
// If any message is refused the kernel discards the whole batch; the error names the first
// refused message.
func (b *batch) send(c *netlink.Conn) error {
	if b.err != nil {
		return b.err
	}
	if len(b.msgs) == 0 {
		return nil
	}
	return sendBatch(c, b.msgs, b.desc)
}

// sendBatch sends msgs between batch markers, as one transaction.
func sendBatch(c *netlink.Conn, msgs []netlink.Message, desc []string) error {
	all := make([]netlink.Message, 0, len(msgs)+2)
	all = append(all, netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_BEGIN), Flags: netlink.Request},
		Data:   nfgen(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES),
	})
	all = append(all, msgs...)
	all = append(all, netlink.Message{
		Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_MSG_BATCH_END), Flags: netlink.Request},
		Data:   nfgen(unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES),
	})
	size := 0
	for _, m := range all {
		size += 16 + len(m.Data)
	}
	if size > 200<<10 {
		// The socket's default send buffer (wmem_default) caps one sendmsg; a batch is one
		// sendmsg, so grow the buffer for big sets.
		_ = c.SetWriteBuffer(size + 64<<10)
	}
	if _, err := c.SendMessages(all); err != nil {
		return fmt.Errorf("send nftables batch: %w", err)
	}
	// The kernel answers every message in order: an ack, or an error.
	for i := range msgs {
		if _, err := c.Receive(); err != nil {
			return &BatchError{Index: i, What: desc[i], Err: err}
		}
	}
	return nil
}

// BatchError is the kernel refusing one message of a batch; the whole batch was discarded.
type BatchError struct {
	Index int    // position in the batch
	What  string // what the message does, e.g. "add rule PROXY_INIT_OUTPUT ..."
	Err   error
}

func (e *BatchError) Error() string {
	return fmt.Sprintf("nftables refused %q (message %d); nothing was written: %v", e.What, e.Index, e.Err)
}

func (e *BatchError) Unwrap() error { return e.Err }

// errNotFound reports whether err is the kernel's "no such object".
func errNotFound(err error) bool { return errors.Is(err, unix.ENOENT) }
