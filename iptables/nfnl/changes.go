package nfnl

// The planner (see the package comment). For iptables-nft's rules it creates what is missing
// (tables and base chains as iptables-nft creates them, our chains), refills our chains whose
// rules differ in any way, deletes stray or duplicate jumps of ours by handle and appends missing
// ones, as iptables -A does. Others' rules are never touched (another's own jump into our chains
// included, until a removal takes the chain it enters), and built-in chains are never flushed.
// The native table, unless it records the same plan and reads back identical, is deleted and
// created anew in the same batch.

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/userdata"
	"github.com/google/nftables/xt"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

var families = []iptables.Family{iptables.IPv4, iptables.IPv6}

// maxElemBytes keeps one NEWSETELEM's element list well under the 64 KiB limit of a netlink
// attribute; larger sets are split over several messages of the same batch.
const maxElemBytes = 48 << 10

// writeXT adds to b what makes our iptables-nft rules in both families exactly rs's: in each of
// our tables (nat, and mangle and raw where rs has chains there), and none of ours in the others.
func (s *State) writeXT(b *Batch, rs *iptables.Ruleset) {
	plan := rs.Plan()
	jumps := rs.XTJumps()
	// Every family's rules first, so that the batch's buffer is sized once: with a thousand
	// rules, growing it copies most of a megabyte.
	perFamily := make([][]iptables.XTRule, len(families))
	n := 0
	for i, f := range families {
		if rs.HasFamily(f) {
			perFamily[i] = rs.XTRules(f)
			n += len(perFamily[i]) + len(jumps)
		}
	}
	b.grow(n+16, n*ruleBytes)
	for i, f := range families {
		for _, tbl := range iptables.XTTables() {
			chains := slices.DeleteFunc(slices.Clone(plan), func(c iptables.PlanChain) bool {
				return c.Table != tbl
			})
			if !rs.HasFamily(f) || len(chains) == 0 {
				s.removeXT(b, f, tbl.Name)
				continue
			}
			s.writeXTTable(b, f, tbl, chains, perFamily[i], jumps)
		}
	}
}

// writeXTTable makes our chains of table tbl in family f exactly chains, with the rules of all
// that are theirs and the jumps of jumps that are the table's.
func (s *State) writeXTTable(b *Batch, f iptables.Family, tbl iptables.XTTable, chains []iptables.PlanChain, all, jumps []iptables.XTRule) {
	fam := xtFamily(f)
	t := s.xtTable(fam, tbl.Name)
	if s.findTable(fam, tbl.Name) == nil || t == nil {
		t = &ruleTable{rules: map[string][]rule{}}
		addTable(b, fam, tbl.Name)
	}
	ourJumps := slices.DeleteFunc(slices.Clone(jumps), func(j iptables.XTRule) bool {
		return j.TableName() != tbl.Name
	})
	writeXTChains(b, f, t, tbl, chains, all)
	// Chains of ours in this table the plan no longer has: emptied, their jumps removed, deleted.
	var stale []string
	for _, c := range t.chains {
		if iptables.ChainTable(c.name) == tbl.Name && !slices.ContainsFunc(chains, func(p iptables.PlanChain) bool { return p.Name == c.name }) {
			stale = append(stale, c.name)
		}
	}
	kept := pruneXTJumps(b, f, t, tbl.Name, stale, ourJumps)
	dropChains(b, fam, tbl.Name, t, stale)
	for i, j := range ourJumps {
		if !kept[j.Chain+" "+j.Target] {
			addXT(b, f, &ourJumps[i])
		}
	}
}

// writeXTChains adds to b the built-in chains our jumps live in, as iptables-nft creates them, if
// missing; then our chains, each with its run of the plan's rules: created if missing, refilled
// if their rules in t differ in any way.
func writeXTChains(b *Batch, f iptables.Family, t *ruleTable, tbl iptables.XTTable, chains []iptables.PlanChain, all []iptables.XTRule) {
	fam := xtFamily(f)
	for _, c := range chains {
		if !t.hasChain(c.Hook.Builtin) {
			addBaseChain(b, fam, tbl, c.Hook)
		}
	}
	for _, c := range chains {
		// The plan's rules are in chain order, so a chain's are one run.
		start := slices.IndexFunc(all, func(r iptables.XTRule) bool { return r.Chain == c.Name })
		end := start
		for start >= 0 && end < len(all) && all[end].Chain == c.Name {
			end++
		}
		rules := all[max(start, 0):max(end, 0)]
		have := t.rules[c.Name]
		switch {
		case !t.hasChain(c.Name):
			addChain(b, fam, tbl.Name, c.Name)
		case sameXT(f, rules, have):
			continue
		case len(have) > 0:
			deleteRule(b, fam, tbl.Name, c.Name, 0)
		}
		for i := range rules {
			addXT(b, f, &rules[i])
		}
	}
}

// pruneXTJumps adds to b what deletes jumps in the built-in chains of t that should go, and
// returns those of ourJumps already in place, keyed "chain target". Of our jumps, the first exact
// one in its built-in chain stays, any other goes, by handle (a missing one is the caller's to
// append). Another's jump into our chains stays, unless the chain it enters is stale.
func pruneXTJumps(b *Batch, f iptables.Family, t *ruleTable, table string, stale []string, ourJumps []iptables.XTRule) map[string]bool {
	fam := xtFamily(f)
	kept := map[string]bool{}
	for _, c := range t.chains {
		if iptables.IsOurChain(c.name) {
			continue
		}
		for _, r := range t.rules[c.name] {
			into, ours := r.jumpTarget(), r.hasOurComment()
			key := c.name + " " + into
			switch {
			case !iptables.IsOurChain(into) || !ours && !slices.Contains(stale, into):
				// not into our chains, or another's jump into one that stays
			case ours && !kept[key] && slices.ContainsFunc(ourJumps, func(j iptables.XTRule) bool {
				return j.Chain == c.name && sameXT(f, []iptables.XTRule{j}, []rule{r})
			}):
				kept[key] = true
			default:
				deleteRule(b, fam, table, c.name, r.handle)
			}
		}
	}
	return kept
}

// removeXT adds to b what deletes our chains and every jump to them in table name of family f.
func (s *State) removeXT(b *Batch, f iptables.Family, name string) {
	fam := xtFamily(f)
	t := s.xtTable(fam, name)
	if t == nil {
		return
	}
	var ours []string
	for _, c := range t.chains {
		if iptables.IsOurChain(c.name) {
			ours = append(ours, c.name)
			continue
		}
		for _, r := range t.rules[c.name] {
			if iptables.IsOurChain(r.jumpTarget()) {
				deleteRule(b, fam, name, c.name, r.handle)
			}
		}
	}
	dropChains(b, fam, name, t, ours)
}

// dropChains deletes chains of t, table name: flushed first, all of them, so none still jumps to
// another when it is deleted.
func dropChains(b *Batch, fam byte, name string, t *ruleTable, chains []string) {
	for _, c := range chains {
		if len(t.rules[c]) > 0 {
			deleteRule(b, fam, name, c, 0)
		}
	}
	for _, c := range chains {
		b.beginIn(unix.NFT_MSG_DELCHAIN, 0, fam, name, unix.NFTA_CHAIN_NAME, c)
		b.add(what{del: true, render: func() string {
			return fmt.Sprintf("delete chain %s %s %s", famName[fam], name, c)
		}})
	}
}

// addTable creates a table of family fam, if missing.
func addTable(b *Batch, fam byte, name string) {
	b.begin(unix.NFT_MSG_NEWTABLE, netlink.Create, fam)
	b.str(unix.NFTA_TABLE_NAME, name)
	b.add(what{text: "add table " + famName[fam] + " " + name})
}

// addChain creates a regular chain.
func addChain(b *Batch, fam byte, tableName, name string) {
	b.beginIn(unix.NFT_MSG_NEWCHAIN, netlink.Create, fam, tableName, unix.NFTA_CHAIN_NAME, name)
	b.add(what{render: func() string {
		return fmt.Sprintf("add chain %s %s %s", famName[fam], tableName, name)
	}})
}

// writeNative adds to b what makes the native table exactly rs's: nothing when it records rs's
// plan and reads back identical, else a new table in its place.
func (s *State) writeNative(b *Batch, rs *iptables.Ruleset) {
	want := rs.NFT()
	t := s.findTable(famInet, iptables.NFTTableName)
	if t != nil && s.native != nil && iptables.CompareNFT(want, nativeTable(s.native, t.comment)).Empty() &&
		int(t.use) == len(s.native.chains)+len(s.native.sets) {
		return
	}
	if t != nil {
		// Created if missing (it is not, but then the delete cannot fail whatever happens in
		// between), deleted, and created anew; the kernel applies all of it or none.
		addTable(b, famInet, iptables.NFTTableName)
		s.removeNative(b)
	}
	addNativeTable(b, want)
}

// nativeReadWorthIt says whether the native table is worth reading in detail before writing
// rs's: only when it records the same plan and holds as many chains and sets, i.e. it may be
// identical, and writing may be unnecessary. Otherwise it is replaced unread.
func nativeReadWorthIt(rs *iptables.Ruleset) func(*table) bool {
	return func(t *table) bool {
		want := rs.NFT()
		return t.comment == want.Comment && int(t.use) == len(want.Chains)+len(want.Sets)
	}
}

// removeNative adds to b what deletes the native table, if it exists.
func (s *State) removeNative(b *Batch) {
	if s.findTable(famInet, iptables.NFTTableName) == nil {
		return
	}
	b.begin(unix.NFT_MSG_DELTABLE, 0, famInet)
	b.str(unix.NFTA_TABLE_NAME, iptables.NFTTableName)
	b.add(what{del: true, text: "delete table inet " + iptables.NFTTableName})
}

// addBaseChain creates a built-in chain of one of iptables-nft's tables: the table's chain type,
// the hook, the table's priority, policy accept, and no counters, exactly as iptables-nft
// creates it. (A chain at another priority makes iptables-nft call the table incompatible.)
func addBaseChain(b *Batch, fam byte, tbl iptables.XTTable, hook iptables.Hook) {
	b.beginBaseChain(fam, tbl.Name, hook.Builtin, tbl.ChainType, hook.Number, int32(tbl.Priority))
	b.add(what{render: func() string {
		typ := ""
		if tbl.ChainType != "nat" {
			typ = tbl.ChainType
		}
		h := iptables.NFTChain{Hook: hook, Priority: tbl.Priority, Type: typ}.Header()
		return fmt.Sprintf("add chain %s %s %s { %s }", famName[fam], tbl.Name, hook.Builtin, h)
	}})
}

// beginBaseChain begins a message creating a base chain of type typ: the hook at that priority,
// policy accept.
func (b *Batch) beginBaseChain(fam byte, table, name, typ string, hook uint32, priority int32) {
	b.beginIn(unix.NFT_MSG_NEWCHAIN, netlink.Create, fam, table, unix.NFTA_CHAIN_NAME, name)
	h := b.nest(unix.NFTA_CHAIN_HOOK)
	b.u32(unix.NFTA_HOOK_HOOKNUM, hook)
	b.u32(unix.NFTA_HOOK_PRIORITY, uint32(priority))
	b.close(h)
	b.u32(unix.NFTA_CHAIN_POLICY, nfAccept)
	b.str(unix.NFTA_CHAIN_TYPE, typ)
}

// addXT appends r to its chain.
func addXT(b *Batch, f iptables.Family, r *iptables.XTRule) {
	fam := xtFamily(f)
	exprs, proto, err := appendXT(b.scratch[:0], &b.pool, f, *r)
	b.scratch = exprs
	if err != nil {
		b.fail(fmt.Errorf("%s rule %q: %w", f, r.Rule().String(), err))
		return
	}
	b.beginRule(fam, r.TableName(), r.Chain, exprs)
	c := b.nest(unix.NFTA_RULE_COMPAT)
	b.u32(unix.NFTA_RULE_COMPAT_PROTO, proto)
	b.u32(unix.NFTA_RULE_COMPAT_FLAGS, 0)
	b.close(c)
	b.add(what{xt: r, fam: fam})
}

// beginRule begins a message appending a rule of exprs to a chain.
func (b *Batch) beginRule(fam byte, table, chain string, exprs []expr.Any) {
	b.beginIn(unix.NFT_MSG_NEWRULE, netlink.Create|netlink.Append, fam, table, unix.NFTA_RULE_CHAIN, chain)
	b.expressions(fam, exprs)
}

// ruleBytes is about what one of our iptables-nft rules takes (its comment alone is 300 bytes).
const ruleBytes = 640

// expressions adds a rule's expression list: each expression's data as google/nftables'
// MarshalExprData gives it (its Marshal copies it once more, with the name), the shared ones once
// per process and family (Batch.marshal), but the xtables matches and targets and the comparisons
// laid out here as it lays them out (see the package comment): its marshalling of them, which
// copies an xtables info three times, was a third of what a 1,000-rule batch allocated.
func (b *Batch) expressions(fam byte, exprs []expr.Any) {
	list := b.nest(unix.NFTA_RULE_EXPRESSIONS)
	for _, e := range exprs {
		el := b.nest(unix.NFTA_LIST_ELEM)
		b.str(unix.NFTA_EXPR_NAME, exprName(e))
		data := b.nest(unix.NFTA_EXPR_DATA)
		switch x := e.(type) {
		case *expr.Match:
			b.xtExpr(fam, x.Name, x.Rev, x.Info)
		case *expr.Target:
			b.xtExpr(fam, x.Name, x.Rev, x.Info)
		case *expr.Cmp:
			if sharedSlot(e) >= 0 {
				b.b = append(b.b, b.marshal(fam, e)...)
				break
			}
			b.u32(unix.NFTA_CMP_SREG, x.Register)
			b.u32(unix.NFTA_CMP_OP, uint32(x.Op))
			v := b.nest(unix.NFTA_CMP_DATA)
			b.attr(unix.NFTA_DATA_VALUE, x.Data)
			b.close(v)
		default:
			b.b = append(b.b, b.marshal(fam, e)...)
		}
		b.close(data)
		b.close(el)
	}
	b.close(list)
}

// xtExpr adds an xtables match's or target's data: its name, revision and info, google/nftables'
// (xt.Marshal) but for the comment, a NUL-padded string.
func (b *Batch) xtExpr(fam byte, name string, rev uint32, info xt.InfoAny) {
	// NFTA_MATCH_* and NFTA_TARGET_* number name, revision and info alike.
	b.str(unix.NFTA_MATCH_NAME, name)
	b.u32(unix.NFTA_MATCH_REV, rev)
	if c, ok := info.(*xt.Comment); ok && len(*c) < xt.CommentSize {
		off := b.open(unix.NFTA_MATCH_INFO)
		b.b = append(b.b, *c...)
		b.b = append(b.b, make([]byte, xt.CommentSize-len(*c))...)
		b.close(off)
	} else {
		raw, err := xt.Marshal(xt.TableFamily(fam), rev, info)
		b.fail(err)
		b.attr(unix.NFTA_MATCH_INFO, raw)
	}
}

// marshal returns e's data as google/nftables marshals it, the shared expressions' only once.
func (b *Batch) marshal(fam byte, e expr.Any) []byte {
	i, f := sharedSlot(e), slices.Index(wireFamilies[:], fam)
	if i < 0 || f < 0 {
		data, err := expr.MarshalExprData(fam, e)
		b.fail(err)
		return data
	}
	if data := sharedWire[f][i].Load(); data != nil {
		return *data
	}
	data, err := expr.MarshalExprData(fam, e)
	if err != nil {
		b.fail(err)
		return nil
	}
	sharedWire[f][i].Store(&data)
	return data
}

// deleteRule deletes a rule by its handle, or, with handle 0 (the kernel's handles start at 1),
// every rule of the chain: flush.
func deleteRule(b *Batch, fam byte, tableName, chainName string, handle uint64) {
	b.beginIn(unix.NFT_MSG_DELRULE, 0, fam, tableName, unix.NFTA_RULE_CHAIN, chainName)
	if handle != 0 {
		b.attr(unix.NFTA_RULE_HANDLE, binary.BigEndian.AppendUint64(nil, handle))
	}
	b.add(what{del: true, render: func() string {
		if handle == 0 {
			return fmt.Sprintf("flush chain %s %s %s", famName[fam], tableName, chainName)
		}
		return fmt.Sprintf("delete rule %s %s %s handle %d", famName[fam], tableName, chainName, handle)
	}})
}

// addNativeTable adds the messages that create t; the table must not exist at that point of the
// batch.
func addNativeTable(b *Batch, t iptables.NFTTable) {
	tbl := iptables.NFTTableName
	b.begin(unix.NFT_MSG_NEWTABLE, netlink.Create, famInet)
	b.str(unix.NFTA_TABLE_NAME, tbl)
	b.u32(unix.NFTA_TABLE_FLAGS, 0)
	// The comment (table user data) records the plan; google/nftables cannot write it.
	b.attr(nftaTableUserdata, userdata.AppendString(nil, udataTableComment, t.Comment))
	b.add(what{render: func() string { return fmt.Sprintf("add table inet %s { comment %s; }", tbl, strconv.Quote(t.Comment)) }})

	setIDs := map[string]uint32{}
	for i := range t.Sets {
		b.setID++
		setIDs[t.Sets[i].Name] = b.setID
		addSet(b, &t.Sets[i], b.setID)
	}
	for _, c := range t.Chains {
		b.beginBaseChain(famInet, tbl, c.Name, cmp.Or(c.Type, "nat"), c.Hook.Number, int32(c.Priority))
		b.add(what{render: func() string { return fmt.Sprintf("add chain inet %s %s { %s }", tbl, c.Name, c.Header()) }})
		for _, r := range c.Rules {
			exprs, err := nativeExprs(r, setIDs)
			if err != nil {
				b.fail(fmt.Errorf("chain %s: rule %q: %w", c.Name, r, err))
				return
			}
			b.beginRule(famInet, tbl, c.Name, exprs)
			if r.Comment != "" {
				b.attr(unix.NFTA_RULE_USERDATA, userdata.AppendString(nil, userdata.TypeComment, r.Comment))
			}
			b.add(what{render: func() string { return fmt.Sprintf("add rule inet %s %s %s", tbl, c.Name, r) }})
		}
	}
}

// addSet adds a constant interval set and its elements, split over messages of at most
// maxElemBytes, each holding whole intervals.
func addSet(b *Batch, s *iptables.NFTSet, id uint32) {
	tbl := iptables.NFTTableName
	typ, keyLen := keyType(s.Type)
	if typ == 0 {
		b.fail(fmt.Errorf("set %s: unknown type %q", s.Name, s.Type))
		return
	}
	for i, iv := range s.Elements {
		if len(iv.First) != keyLen || len(iv.Last) != keyLen {
			b.fail(fmt.Errorf("set %s: element %d has the wrong key length", s.Name, i))
			return
		}
	}
	b.beginIn(unix.NFT_MSG_NEWSET, netlink.Create, famInet, tbl, unix.NFTA_SET_NAME, s.Name)
	b.u32(unix.NFTA_SET_FLAGS, unix.NFT_SET_CONSTANT|unix.NFT_SET_INTERVAL)
	b.u32(unix.NFTA_SET_KEY_TYPE, typ)
	b.u32(unix.NFTA_SET_KEY_LEN, uint32(keyLen))
	b.u32(unix.NFTA_SET_ID, id)
	desc := b.nest(unix.NFTA_SET_DESC)
	size := len(b.b) + 4 // where the value goes, once the elements below are counted
	b.u32(unix.NFTA_SET_DESC_SIZE, 0)
	b.close(desc)
	// Key byte order "big endian", as nft records it, so `nft list` prints the keys.
	b.attr(unix.NFTA_SET_USERDATA, userdata.AppendUint32(nil, userdata.NFTNL_UDATA_SET_KEYBYTEORDER, 2))
	b.add(what{render: func() string {
		return fmt.Sprintf("add set inet %s %s { type %s; flags %s; }", tbl, s.Name, s.Type, s.FlagList())
	}})

	// The elements the way nft lays intervals out: each interval as its first key and, flagged
	// as an interval end, the key after its last (none when it runs to the top of the key
	// space); the first preceded by an end marker at zero when it starts above zero.
	open, list, from, n := false, 0, 0, 0
	elem := func(key []byte, end bool) {
		n++
		el := b.nest(unix.NFTA_LIST_ELEM)
		k := b.nest(unix.NFTA_SET_ELEM_KEY)
		b.attr(unix.NFTA_DATA_VALUE, key)
		b.close(k)
		if end {
			b.u32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
		}
		b.close(el)
	}
	for i, iv := range s.Elements {
		if !open {
			b.beginIn(unix.NFT_MSG_NEWSETELEM, netlink.Create, famInet, tbl, unix.NFTA_SET_ELEM_LIST_SET, s.Name)
			b.u32(unix.NFTA_SET_ELEM_LIST_SET_ID, id)
			open, list, from = true, b.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS), i
		}
		if i == 0 && !isZero(iv.First) {
			elem(make([]byte, keyLen), true)
		}
		elem(iv.First, false)
		if after, ok := iv.After(); ok {
			elem(after, true)
		}
		if len(b.b)-b.start >= maxElemBytes || i == len(s.Elements)-1 {
			b.close(list)
			b.add(what{set: s, from: from, to: i + 1})
			open = false
		}
	}
	binary.BigEndian.PutUint32(b.b[size:], uint32(n))
}

// jumpTarget is the chain the rule's verdict jumps or goes to, or "".
func (r rule) jumpTarget() string {
	for _, e := range r.exprs {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) {
			return v.Chain
		}
	}
	return ""
}

// hasOurComment reports whether the rule carries a comment match of ours: as for
// iptables.ParseSave, what tells our jumps from another's, which an apply keeps.
func (r rule) hasOurComment() bool {
	for _, e := range r.exprs {
		if m, ok := e.(*expr.Match); ok {
			if c, ok := m.Info.(*xt.Comment); ok && strings.HasPrefix(string(*c), iptables.CommentPrefix) {
				return true
			}
		}
	}
	return false
}

// sameXT reports whether a chain holds exactly the wanted rules, in order.
func sameXT(f iptables.Family, want []iptables.XTRule, have []rule) bool {
	return slices.EqualFunc(want, have, func(w iptables.XTRule, h rule) bool {
		e, _, err := encodeXT(f, w)
		return err == nil && h.foreign == "" && sameExprs(xtFamily(f), e, h.exprs)
	})
}

// saved returns our chains and rules in family f the way iptables-nft-save lists them, table by
// table (iptables.XTTables): jumps in built-in chains first (in hook order), then the rules of
// user chains by chain name. Lines outside the nat table start with their table.
func (s *State) saved(f iptables.Family) iptables.SavedState {
	var out iptables.SavedState
	for _, tbl := range iptables.XTTables() {
		t := s.xtTable(xtFamily(f), tbl.Name)
		if t == nil {
			continue
		}
		chains := slices.Clone(t.chains)
		sort.SliceStable(chains, func(i, j int) bool {
			a, b := chains[i], chains[j]
			if a.base != b.base {
				return a.base
			}
			if a.base {
				return a.hook < b.hook
			}
			return a.name < b.name
		})
		for _, c := range chains {
			ours := iptables.ChainTable(c.name) == tbl.Name
			if ours {
				out.Chains = append(out.Chains, c.name)
			}
			for _, r := range t.rules[c.name] {
				into := iptables.ChainTable(r.jumpTarget()) == tbl.Name
				switch {
				case ours || into && r.hasOurComment():
					out.Rules = append(out.Rules, r.line(f, tbl.Name, c.name))
				case into:
					out.ForeignJumps = append(out.ForeignJumps, r.line(f, tbl.Name, c.name))
				}
			}
		}
	}
	return out
}

// line renders a rule as iptables-nft-save prints it, or, for a rule we would not have written,
// says so with what it holds.
func (r rule) line(f iptables.Family, tableName, chainName string) string {
	if x, ok := decodeXT(f, tableName, chainName, r); ok {
		return x.Rule().String()
	}
	what := r.foreign
	if what == "" {
		var parts []string
		for _, e := range r.exprs {
			parts = append(parts, strings.TrimPrefix(fmt.Sprintf("%T", e), "*expr."))
		}
		what = strings.Join(parts, " ")
	}
	return iptables.Rule{Table: tableName, Chain: chainName, Spec: fmt.Sprintf("[rule handle %d not written by proxy-init: %s]", r.handle, what)}.String()
}
