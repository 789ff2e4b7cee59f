package nfnl

// The planner: a State and what should be in place turn into one batch. It writes one
// representation of our rules (iptables-nft's, or the native table) and removes ours from the
// other, or removes both; what it leaves alone is everyone else's.
//
// iptables-nft's rules: it creates what is missing (the tables and base chains as iptables-nft
// creates them, our chains), refills our chains whose rules differ in any way, deletes stray or
// duplicate jumps of ours by handle and appends missing ones, as iptables -A does. Rules of
// others in PREROUTING and OUTPUT are never touched (another's own jump into our chains included,
// until a removal takes the chain it enters), and built-in chains are never flushed.
//
// The native table: when it records the same plan and reads back identical, nothing; otherwise it
// is deleted and created anew with its sets, chains and rules, in the same batch.

import (
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

// writeXT adds to b what makes our iptables-nft rules in both families exactly rs's.
func (s *State) writeXT(b *Batch, rs *iptables.Ruleset) {
	jumps := iptables.XTJumps()
	hooks := map[string]uint32{}
	for _, c := range iptables.Chains() {
		hooks[c.Hook.Builtin] = c.Hook.Number
	}
	for _, f := range families {
		if !rs.HasFamily(f) {
			s.removeXT(b, f)
			continue
		}
		fam := xtFamily(f)
		t := s.nat[fam]
		if s.findTable(fam, iptables.Table) == nil || t == nil {
			t = &ruleTable{rules: map[string][]rule{}}
			m := newMsg(unix.NFT_MSG_NEWTABLE, netlink.Create, fam, 0)
			m.str(unix.NFTA_TABLE_NAME, iptables.Table)
			b.add(m, what{text: "add table " + famName(fam) + " " + iptables.Table})
		}
		// The built-in chains our jumps live in, as iptables-nft creates them, if missing.
		for _, j := range jumps {
			if t.chain(j.Chain) == nil {
				addBaseChain(b, fam, j.Chain, hooks[j.Chain])
			}
		}
		// Our chains, each a run of the plan's rules: created if missing, refilled if their
		// rules differ in any way.
		all := rs.XTRules(f)
		b.grow(len(all) + len(jumps) + 8)
		for start := 0; start < len(all); {
			chainName, end := all[start].Chain, start
			for end < len(all) && all[end].Chain == chainName {
				end++
			}
			rules := all[start:end]
			start = end
			have := t.rules[chainName]
			switch {
			case t.chain(chainName) == nil:
				m := newMsg(unix.NFT_MSG_NEWCHAIN, netlink.Create, fam, 0)
				m.str(unix.NFTA_CHAIN_TABLE, iptables.Table)
				m.str(unix.NFTA_CHAIN_NAME, chainName)
				b.add(m, what{text: fmt.Sprintf("add chain %s %s %s", famName(fam), iptables.Table, chainName)})
			case sameXT(f, rules, have):
				continue
			case len(have) > 0:
				flush(b, fam, iptables.Table, chainName)
			}
			for i := range rules {
				addXT(b, f, &rules[i])
			}
		}
		// Jumps of ours: the first exact one in its built-in chain stays, any other goes, by
		// handle, and a missing one is appended. Another's jump into our chains stays.
		kept := map[string]bool{}
		for _, c := range t.chains {
			if iptables.IsOurChain(c.name) {
				continue
			}
			for _, r := range t.rules[c.name] {
				if !r.jumpsToOurs() || !r.hasOurComment() {
					continue
				}
				if !kept[c.name] && slices.ContainsFunc(jumps, func(j iptables.XTRule) bool { return j.Chain == c.name && sameXT(f, []iptables.XTRule{j}, []rule{r}) }) {
					kept[c.name] = true
					continue
				}
				deleteRule(b, fam, c.name, r.handle)
			}
		}
		for i, j := range jumps {
			if !kept[j.Chain] {
				addXT(b, f, &jumps[i])
			}
		}
	}
}

// removeXT adds to b what deletes our chains and every jump to them in family f.
func (s *State) removeXT(b *Batch, f iptables.Family) {
	fam := xtFamily(f)
	t := s.nat[fam]
	if t == nil {
		return
	}
	for _, c := range t.chains {
		if iptables.IsOurChain(c.name) {
			continue
		}
		for _, r := range t.rules[c.name] {
			if r.jumpsToOurs() {
				deleteRule(b, fam, c.name, r.handle)
			}
		}
	}
	// Flushed first, all of them, so neither still jumps to the other when it is deleted.
	for _, c := range t.chains {
		if iptables.IsOurChain(c.name) && len(t.rules[c.name]) > 0 {
			flush(b, fam, iptables.Table, c.name)
		}
	}
	for _, c := range t.chains {
		if iptables.IsOurChain(c.name) {
			m := newMsg(unix.NFT_MSG_DELCHAIN, 0, fam, 0)
			m.str(unix.NFTA_CHAIN_TABLE, iptables.Table)
			m.str(unix.NFTA_CHAIN_NAME, c.name)
			b.add(m, what{del: true, text: fmt.Sprintf("delete chain %s %s %s", famName(fam), iptables.Table, c.name)})
		}
	}
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
		m := newMsg(unix.NFT_MSG_NEWTABLE, netlink.Create, famInet, 0)
		m.str(unix.NFTA_TABLE_NAME, iptables.NFTTableName)
		b.add(m, what{text: "add table inet " + iptables.NFTTableName})
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
	m := newMsg(unix.NFT_MSG_DELTABLE, 0, famInet, 0)
	m.str(unix.NFTA_TABLE_NAME, iptables.NFTTableName)
	b.add(m, what{del: true, text: "delete table inet " + iptables.NFTTableName})
}

// addBaseChain creates a built-in chain of iptables-nft's nat table: type nat, the hook, the nat
// priority, policy accept, and no counters, exactly as iptables-nft creates it.
func addBaseChain(b *Batch, fam byte, chainName string, hook uint32) {
	m := newMsg(unix.NFT_MSG_NEWCHAIN, netlink.Create, fam, 0)
	m.str(unix.NFTA_CHAIN_TABLE, iptables.Table)
	m.str(unix.NFTA_CHAIN_NAME, chainName)
	baseChain(m, hook, natPriority)
	b.add(m, what{text: fmt.Sprintf("add chain %s %s %s { %s }", famName(fam), iptables.Table, chainName, header(hook, natPriority))})
}

func baseChain(m *msg, hook uint32, priority int32) {
	h := m.nest(unix.NFTA_CHAIN_HOOK)
	m.u32(unix.NFTA_HOOK_HOOKNUM, hook)
	m.u32(unix.NFTA_HOOK_PRIORITY, uint32(priority))
	m.close(h)
	m.u32(unix.NFTA_CHAIN_POLICY, nfAccept)
	m.str(unix.NFTA_CHAIN_TYPE, "nat")
}

func header(hook uint32, priority int32) string {
	return iptables.NFTChain{Hook: iptables.HookByNumber(hook), Priority: int(priority)}.Header()
}

// addXT appends r to its chain.
func addXT(b *Batch, f iptables.Family, r *iptables.XTRule) {
	fam := xtFamily(f)
	exprs, proto, err := encodeXT(f, *r)
	if err != nil {
		b.fail(fmt.Errorf("%s rule %q: %w", f, r.Rule().String(), err))
		return
	}
	m := newMsg(unix.NFT_MSG_NEWRULE, netlink.Create|netlink.Append, fam, ruleBytes)
	m.str(unix.NFTA_RULE_TABLE, iptables.Table)
	m.str(unix.NFTA_RULE_CHAIN, r.Chain)
	b.expressions(m, fam, exprs)
	c := m.nest(unix.NFTA_RULE_COMPAT)
	m.u32(unix.NFTA_RULE_COMPAT_PROTO, proto)
	m.u32(unix.NFTA_RULE_COMPAT_FLAGS, 0)
	m.close(c)
	b.add(m, what{xt: r, fam: fam})
}

// ruleBytes is about what one of our iptables-nft rules takes (its comment alone is 300 bytes).
const ruleBytes = 640

// expressions adds a rule's expression list, each marshalled by google/nftables.
func (b *Batch) expressions(m *msg, fam byte, exprs []expr.Any) {
	list := m.nest(unix.NFTA_RULE_EXPRESSIONS)
	for _, e := range exprs {
		data, err := expr.Marshal(fam, e)
		b.fail(err)
		m.attr(unix.NLA_F_NESTED|unix.NFTA_LIST_ELEM, data)
	}
	m.close(list)
}

func deleteRule(b *Batch, fam byte, chainName string, handle uint64) {
	m := newMsg(unix.NFT_MSG_DELRULE, 0, fam, 0)
	m.str(unix.NFTA_RULE_TABLE, iptables.Table)
	m.str(unix.NFTA_RULE_CHAIN, chainName)
	m.u64(unix.NFTA_RULE_HANDLE, handle)
	b.add(m, what{del: true, text: fmt.Sprintf("delete rule %s %s %s handle %d", famName(fam), iptables.Table, chainName, handle)})
}

// flush deletes every rule of a chain: a rule deletion that names no handle.
func flush(b *Batch, fam byte, tableName, chainName string) {
	m := newMsg(unix.NFT_MSG_DELRULE, 0, fam, 0)
	m.str(unix.NFTA_RULE_TABLE, tableName)
	m.str(unix.NFTA_RULE_CHAIN, chainName)
	b.add(m, what{del: true, text: fmt.Sprintf("flush chain %s %s %s", famName(fam), tableName, chainName)})
}

// addNativeTable adds the messages that create t; the table must not exist at that point of the
// batch.
func addNativeTable(b *Batch, t iptables.NFTTable) {
	tbl := iptables.NFTTableName
	m := newMsg(unix.NFT_MSG_NEWTABLE, netlink.Create, famInet, 0)
	m.str(unix.NFTA_TABLE_NAME, tbl)
	m.u32(unix.NFTA_TABLE_FLAGS, 0)
	// The comment (table user data) records the plan; google/nftables cannot write it.
	m.attr(nftaTableUserdata, userdata.AppendString(nil, udataTableComment, t.Comment))
	b.add(m, what{text: fmt.Sprintf("add table inet %s { comment %s; }", tbl, strconv.Quote(t.Comment))})

	setIDs := map[string]uint32{}
	for i := range t.Sets {
		b.setID++
		setIDs[t.Sets[i].Name] = b.setID
		addSet(b, &t.Sets[i], b.setID)
	}
	for _, c := range t.Chains {
		m := newMsg(unix.NFT_MSG_NEWCHAIN, netlink.Create, famInet, 0)
		m.str(unix.NFTA_CHAIN_TABLE, tbl)
		m.str(unix.NFTA_CHAIN_NAME, c.Name)
		baseChain(m, c.Hook.Number, int32(c.Priority))
		b.add(m, what{text: fmt.Sprintf("add chain inet %s %s { %s }", tbl, c.Name, c.Header())})
		for _, r := range c.Rules {
			exprs, err := nativeExprs(r, setIDs)
			if err != nil {
				b.fail(fmt.Errorf("chain %s: rule %q: %w", c.Name, r, err))
				return
			}
			m := newMsg(unix.NFT_MSG_NEWRULE, netlink.Create|netlink.Append, famInet, ruleBytes)
			m.str(unix.NFTA_RULE_TABLE, tbl)
			m.str(unix.NFTA_RULE_CHAIN, c.Name)
			b.expressions(m, famInet, exprs)
			if r.Comment != "" {
				m.attr(unix.NFTA_RULE_USERDATA, userdata.AppendString(nil, userdata.TypeComment, r.Comment))
			}
			b.add(m, what{text: fmt.Sprintf("add rule inet %s %s %s", tbl, c.Name, r)})
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
	m := newMsg(unix.NFT_MSG_NEWSET, netlink.Create, famInet, 0)
	m.str(unix.NFTA_SET_TABLE, tbl)
	m.str(unix.NFTA_SET_NAME, s.Name)
	m.u32(unix.NFTA_SET_FLAGS, unix.NFT_SET_CONSTANT|unix.NFT_SET_INTERVAL)
	m.u32(unix.NFTA_SET_KEY_TYPE, typ)
	m.u32(unix.NFTA_SET_KEY_LEN, uint32(keyLen))
	m.u32(unix.NFTA_SET_ID, id)
	desc := m.nest(unix.NFTA_SET_DESC)
	m.u32(unix.NFTA_SET_DESC_SIZE, uint32(elementCount(s.Elements)))
	m.close(desc)
	// Key byte order "big endian", as nft records it, so `nft list` prints the keys.
	m.attr(unix.NFTA_SET_USERDATA, userdata.AppendUint32(nil, userdata.NFTNL_UDATA_SET_KEYBYTEORDER, 2))
	b.add(m, what{text: fmt.Sprintf("add set inet %s %s { type %s; flags %s; }", tbl, s.Name, s.Type, s.FlagList())})

	// The elements the way nft lays intervals out: each interval as its first key and, flagged
	// as an interval end, the key after its last (none when it runs to the top of the key
	// space); the first preceded by an end marker at zero when it starts above zero.
	perElem := 4 + 4 + 4 + (keyLen+3)&^3 + 8
	m = nil
	var list, from int
	elem := func(key []byte, end bool) {
		el := m.nest(unix.NFTA_LIST_ELEM)
		k := m.nest(unix.NFTA_SET_ELEM_KEY)
		m.attr(unix.NFTA_DATA_VALUE, key)
		m.close(k)
		if end {
			m.u32(unix.NFTA_SET_ELEM_FLAGS, unix.NFT_SET_ELEM_INTERVAL_END)
		}
		m.close(el)
	}
	for i, iv := range s.Elements {
		if m == nil {
			m = newMsg(unix.NFT_MSG_NEWSETELEM, netlink.Create, famInet, min(perElem*2*(len(s.Elements)-i+1), maxElemBytes+256))
			m.str(unix.NFTA_SET_ELEM_LIST_TABLE, tbl)
			m.str(unix.NFTA_SET_ELEM_LIST_SET, s.Name)
			m.u32(unix.NFTA_SET_ELEM_LIST_SET_ID, id)
			list, from = m.nest(unix.NFTA_SET_ELEM_LIST_ELEMENTS), i
		}
		if i == 0 && !isZero(iv.First) {
			elem(make([]byte, keyLen), true)
		}
		elem(iv.First, false)
		if after, ok := iv.After(); ok {
			elem(after, true)
		}
		if len(m.b) >= maxElemBytes || i == len(s.Elements)-1 {
			m.close(list)
			b.add(m, what{set: s, from: from, to: i + 1})
			m = nil
		}
	}
}

// elementCount is how many set elements the intervals take (see addSet).
func elementCount(ivs []iptables.NFTInterval) int {
	n := 0
	for i, iv := range ivs {
		if i == 0 && !isZero(iv.First) {
			n++
		}
		n++
		if _, ok := iv.After(); ok {
			n++
		}
	}
	return n
}

// jumpsToOurs reports whether the rule's verdict enters one of our chains.
func (r rule) jumpsToOurs() bool {
	for _, e := range r.exprs {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) && iptables.IsOurChain(v.Chain) {
			return true
		}
	}
	return false
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
	if len(want) != len(have) {
		return false
	}
	for i := range want {
		e, _, err := encodeXT(f, want[i])
		if err != nil || have[i].foreign != "" || !sameExprs(xtFamily(f), e, have[i].exprs) {
			return false
		}
	}
	return true
}

// saved returns our chains and rules in family f the way iptables-nft-save lists them: jumps in
// built-in chains first (in hook order), then the rules of user chains by chain name.
func (s *State) saved(f iptables.Family) iptables.SavedState {
	var out iptables.SavedState
	t := s.nat[xtFamily(f)]
	if t == nil {
		return out
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
		ours := iptables.IsOurChain(c.name)
		if ours {
			out.Chains = append(out.Chains, c.name)
		}
		for _, r := range t.rules[c.name] {
			switch {
			case ours:
				out.Rules = append(out.Rules, r.line(f, c.name))
			case r.jumpsToOurs() && r.hasOurComment():
				out.Rules = append(out.Rules, r.line(f, c.name))
			case r.jumpsToOurs():
				out.ForeignJumps = append(out.ForeignJumps, r.line(f, c.name))
			}
		}
	}
	return out
}

// line renders a rule as iptables-nft-save prints it, or, for a rule we would not have written,
// says so with what it holds.
func (r rule) line(f iptables.Family, chainName string) string {
	if x, ok := decodeXT(f, chainName, r); ok {
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
	return fmt.Sprintf("-A %s [rule handle %d not written by proxy-init: %s]", chainName, r.handle, what)
}
