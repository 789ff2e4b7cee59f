// Package xtnft writes our rules in iptables-nft's own representation, over netlink, with no
// binary and no exec: the "ip nat" and "ip6 nat" tables, the base chains PREROUTING and OUTPUT,
// our two chains, the jumps and every match, target and comment exactly as iptables-nft-restore
// would write them for the same iptables-restore payload. `iptables -t nat -S` (iptables-nft)
// therefore shows them, and iptables-nft-save prints them byte for byte as it prints its own.
//
// It renders the builder's structured iptables rules (iptables.Ruleset.XTRules); it decides
// nothing about which rules exist. What it writes and reads is the expressions iptables-nft 1.8.9
// uses (see encode.go); a rule read back counts as ours only if it is exactly such a rule.
//
// Apply reads the nat tables (one round trip in a fresh namespace, four otherwise), then sends
// one nf_tables transaction for both families: it creates what is missing (the tables and base
// chains as iptables-nft creates them, our chains), refills our chains that differ, deletes
// stray or duplicate jumps of ours by handle and adds missing ones. Rules of others in PREROUTING
// and OUTPUT are never touched (another's own jump into our chains included: cleanup removes it
// with the chain it enters), and built-in chains are never flushed. The same transaction deletes the
// native nftables backend's table, if any, so one backend's rules redirect at a time. When
// everything already matches, nothing is sent. The transaction carries the ruleset generation
// it was planned from: if anything changed the ruleset in between, the kernel refuses it whole
// and Apply plans again.
//
// Limits: it needs CAP_NET_ADMIN in the namespace (a *iptables.CapabilityError otherwise) and a
// kernel with nf_tables, nft_compat and the xt_owner, xt_multiport, xt_comment and
// xt_REDIRECT extensions, which iptables-nft needs too. Sockets are opened in the calling
// thread's network namespace (enter it first, internal/netnsutil) and closed before returning.
// It cannot see iptables-legacy rules.
package xtnft

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/internal/errclass"
)

// Name is what logs and show call this backend: the rules are iptables-nft's.
const Name = "iptables-nft"

// nativeTable is the native nftables backend's table, removed when this backend writes.
const (
	nativeFamily = unix.NFPROTO_INET
	nativeTable  = iptables.NFTTableName
)

// Applier writes, reads back and removes our rules in iptables-nft's tables. It holds no state
// between calls. It implements iptables.Applier.
type Applier struct{}

var _ iptables.Applier = (*Applier)(nil)

// New returns an applier.
func New() *Applier { return &Applier{} }

// Name returns "iptables-nft".
func (a *Applier) Name() string { return Name }

// ClearsOnApply names the backend whose rules of ours Apply removes in its own transaction: the
// native nftables table.
func (a *Applier) ClearsOnApply() []string { return []string{"nftables"} }

var families = []iptables.Family{iptables.IPv4, iptables.IPv6}

// Apply makes our rules in both families exactly rs's, in one transaction, and writes nothing
// when they already are.
func (a *Applier) Apply(ctx context.Context, rs *iptables.Ruleset) (iptables.Result, error) {
	if rs == nil {
		return iptables.Result{}, errors.New("iptables-nft apply: no ruleset")
	}
	return transact(ctx, "write the iptables-nft nat rules", func(s *state, m *msgs) error { return s.apply(m, rs) })
}

// Cleanup deletes our chains and every jump to them in both families, leaving the tables, the
// built-in chains and everyone else's rules. It succeeds when there is nothing to remove.
func (a *Applier) Cleanup(ctx context.Context) error {
	_, err := transact(ctx, "remove the iptables-nft nat rules", func(s *state, m *msgs) error {
		for _, f := range families {
			s.remove(m, f)
		}
		return nil
	})
	return err
}

// attempts bounds the re-plans after the kernel refused a transaction because the ruleset
// changed between reading and writing (another writer at the same moment).
const attempts = 3

// transact reads the ruleset, lets plan add messages, and commits them, planning again from a
// fresh read when the ruleset changed in between.
func transact(ctx context.Context, op string, plan func(*state, *msgs) error) (iptables.Result, error) {
	for i := 1; ; i++ {
		if err := ctx.Err(); err != nil {
			return iptables.Result{}, err
		}
		res, err := transactOnce(plan)
		if err == nil {
			return res, nil
		}
		var be *batchError
		// ERESTART: the generation moved. ENOENT or EBUSY on a deletion: a rule or chain read a
		// moment ago vanished or gained a user, on a kernel without generation checks. (ENOENT
		// on an addition is a kernel without the extension: trying again cannot help.)
		if i < attempts && errors.As(err, &be) && (be.err == unix.ERESTART || be.del && (be.err == unix.ENOENT || be.err == unix.EBUSY)) {
			continue
		}
		return res, errclass.Netlink(op, err)
	}
}

func transactOnce(plan func(*state, *msgs) error) (iptables.Result, error) {
	c, err := dial()
	if err != nil {
		return iptables.Result{}, err
	}
	defer c.close()
	s, err := read(c)
	if err != nil {
		return iptables.Result{}, err
	}
	m := newBatch(s.genID)
	if err := plan(s, m); err != nil {
		return iptables.Result{}, err
	}
	if m.seq == 0 {
		return iptables.Result{Changed: false}, nil
	}
	if err := c.commit(m); err != nil {
		return iptables.Result{}, err
	}
	return iptables.Result{Changed: true}, nil
}

// Present lists our chains and rules in place, prefixed with their family, and someone else's
// jumps into our chains: what Cleanup would remove.
func (a *Applier) Present(ctx context.Context) ([]string, error) {
	s, err := readOnce(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, f := range families {
		out = append(out, s.saved(f).Present(f)...)
	}
	return out, nil
}

// readOnce reads the ruleset on a connection of its own.
func readOnce(ctx context.Context) (*state, error) {
	const op = "read the iptables-nft nat rules"
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c, err := dial()
	if err != nil {
		return nil, errclass.Netlink(op, err)
	}
	defer c.close()
	s, err := read(c)
	if err != nil {
		return nil, errclass.Netlink(op, err)
	}
	return s, nil
}

// Show reads our rules back as iptables-nft-save lines, per family, and compares them with rs's.
// A family rs does not cover is expected to hold none of our rules.
func (a *Applier) Show(ctx context.Context, rs *iptables.Ruleset) (iptables.State, error) {
	if rs == nil {
		return iptables.State{}, errors.New("iptables-nft show: no ruleset")
	}
	s, err := readOnce(ctx)
	if err != nil {
		return iptables.State{}, err
	}
	st := iptables.State{Backend: Name}
	for _, f := range families {
		st.Families = append(st.Families, rs.FamilyState(f, s.saved(f)))
	}
	return st, nil
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

// saved returns our chains and rules in family f the way iptables-nft-save lists them: jumps in
// built-in chains first (in hook order), then the rules of user chains by chain name.
func (s *state) saved(f iptables.Family) iptables.SavedState {
	var out iptables.SavedState
	t := s.nat[family(f)]
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
		if iptables.IsOurChain(c.name) {
			out.Chains = append(out.Chains, c.name)
		}
		for _, r := range t.rules[c.name] {
			switch {
			case iptables.IsOurChain(c.name):
				out.Rules = append(out.Rules, r.line(f, c.name))
			case r.jumpsToOurs():
				if l := r.line(f, c.name); ourJump(l) {
					out.Rules = append(out.Rules, l)
				} else {
					out.ForeignJumps = append(out.ForeignJumps, l)
				}
			}
		}
	}
	return out
}

// ourJump reports whether a line that jumps into our chains is one of ours, by its comment, as
// iptables.ParseSave tells them apart: another's jump stays on apply, and goes on cleanup only,
// with the chain it enters.
func ourJump(line string) bool { return strings.Contains(line, ` --comment "`+iptables.CommentPrefix) }

// line renders a rule as iptables-nft-save prints it, or, for a rule we would not have written,
// says so with what it holds.
func (r rule) line(f iptables.Family, chain string) string {
	if r.foreign == "" {
		if x, ok := decode(f, chain, r.exprs); ok {
			return x.Rule().String()
		}
	}
	what := r.foreign
	if what == "" {
		var parts []string
		for _, e := range r.exprs {
			parts = append(parts, strings.TrimPrefix(fmt.Sprintf("%T", e), "*expr."))
		}
		what = strings.Join(parts, " ")
	}
	return fmt.Sprintf("-A %s [rule handle %d not written by proxy-init: %s]", chain, r.handle, what)
}

// apply adds to m what makes family by family the rules exactly rs's.
func (s *state) apply(m *msgs, rs *iptables.Ruleset) error {
	// The hooks come from the builder's chains, like the rules: each of ours hangs from a
	// built-in one.
	hooks := map[string]uint32{}
	for _, c := range iptables.Chains() {
		hooks[c.Hook.Builtin] = c.Hook.Number
	}
	jumps := iptables.XTJumps()
	for _, f := range families {
		if !rs.HasFamily(f) {
			s.remove(m, f)
			continue
		}
		fam := family(f)
		t := s.nat[fam]
		if t == nil {
			t = &natTable{rules: map[string][]rule{}}
			m.beginNFT(unix.NFT_MSG_NEWTABLE, unix.NLM_F_REQUEST|unix.NLM_F_CREATE, fam)
			m.str(unix.NFTA_TABLE_NAME, iptables.Table)
			m.end(fmt.Sprintf("create table %s %s", famName(fam), iptables.Table))
		}
		// The built-in chains our jumps live in, as iptables-nft creates them, if missing.
		for _, j := range jumps {
			if t.chain(j.Chain) == nil {
				addBaseChain(m, fam, j.Chain, hooks[j.Chain])
			}
		}
		// Our chains, each a run of the plan's rules: created if missing, refilled if their
		// rules differ in any way.
		all := rs.XTChainRules(f)
		m.grow(len(all) * ruleBytes)
		for start := 0; start < len(all); {
			name, end := all[start].Chain, start
			for end < len(all) && all[end].Chain == name {
				end++
			}
			rules := all[start:end]
			start = end
			have := t.rules[name]
			switch {
			case t.chain(name) == nil:
				m.beginNFT(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_REQUEST|unix.NLM_F_CREATE, fam)
				m.str(unix.NFTA_CHAIN_TABLE, iptables.Table)
				m.str(unix.NFTA_CHAIN_NAME, name)
				m.end(fmt.Sprintf("create chain %s %s %s", famName(fam), iptables.Table, name))
			case sameRules(f, rules, have):
				continue
			case len(have) > 0:
				flush(m, fam, name)
			}
			for i := range rules {
				if err := addRule(m, f, &rules[i]); err != nil {
					return err
				}
			}
		}
		// Jumps of ours: the first exact one in its built-in chain stays, any other goes, by
		// handle, and a missing one is appended, as iptables -A does. Another's jump into our
		// chains stays.
		kept := map[string]bool{}
		for _, c := range t.chains {
			if iptables.IsOurChain(c.name) {
				continue
			}
			for _, r := range t.rules[c.name] {
				if !r.jumpsToOurs() || !ourJump(r.line(f, c.name)) {
					continue
				}
				if x, ok := r.decode(f, c.name); ok && !kept[c.name] && slices.ContainsFunc(jumps, func(j iptables.XTRule) bool { return j.Rule() == x.Rule() }) {
					kept[c.name] = true
					continue
				}
				deleteRule(m, fam, c.name, r.handle)
			}
		}
		for _, j := range jumps {
			if kept[j.Chain] {
				continue
			}
			if err := addRule(m, f, &j); err != nil {
				return err
			}
		}
	}
	if s.native {
		m.beginNFT(unix.NFT_MSG_DELTABLE, unix.NLM_F_REQUEST, nativeFamily)
		m.str(unix.NFTA_TABLE_NAME, nativeTable)
		m.endWhat(what{del: true, text: "delete the nftables backend's table inet " + nativeTable})
	}
	return nil
}

// remove adds to m what deletes our chains and every jump to them in family f.
func (s *state) remove(m *msgs, f iptables.Family) {
	fam := family(f)
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
				deleteRule(m, fam, c.name, r.handle)
			}
		}
	}
	// Flushed first, all of them, so neither still jumps to the other when it is deleted.
	for _, c := range t.chains {
		if iptables.IsOurChain(c.name) && len(t.rules[c.name]) > 0 {
			flush(m, fam, c.name)
		}
	}
	for _, c := range t.chains {
		if iptables.IsOurChain(c.name) {
			m.beginNFT(unix.NFT_MSG_DELCHAIN, unix.NLM_F_REQUEST, fam)
			m.str(unix.NFTA_CHAIN_TABLE, iptables.Table)
			m.str(unix.NFTA_CHAIN_NAME, c.name)
			m.endWhat(what{del: true, text: fmt.Sprintf("delete chain %s %s %s", famName(fam), iptables.Table, c.name)})
		}
	}
}

// addBaseChain creates a built-in chain of iptables-nft's nat table: type nat, the hook, the nat
// priority, policy accept, and no counters, exactly as iptables-nft creates it.
func addBaseChain(m *msgs, fam byte, name string, hook uint32) {
	m.beginNFT(unix.NFT_MSG_NEWCHAIN, unix.NLM_F_REQUEST|unix.NLM_F_CREATE, fam)
	m.str(unix.NFTA_CHAIN_TABLE, iptables.Table)
	m.str(unix.NFTA_CHAIN_NAME, name)
	h := m.nest(unix.NFTA_CHAIN_HOOK)
	m.u32(unix.NFTA_HOOK_HOOKNUM, hook)
	prio := int32(natPriority)
	m.u32(unix.NFTA_HOOK_PRIORITY, uint32(prio))
	m.unnest(h)
	m.u32(unix.NFTA_CHAIN_POLICY, nfAccept)
	m.str(unix.NFTA_CHAIN_TYPE, "nat")
	m.end(fmt.Sprintf("create built-in chain %s %s %s", famName(fam), iptables.Table, name))
}

// addRule appends r to its chain.
func addRule(m *msgs, f iptables.Family, r *iptables.XTRule) error {
	fam := family(f)
	m.beginNFT(unix.NFT_MSG_NEWRULE, unix.NLM_F_REQUEST|unix.NLM_F_CREATE|unix.NLM_F_APPEND, fam)
	m.str(unix.NFTA_RULE_TABLE, iptables.Table)
	m.str(unix.NFTA_RULE_CHAIN, r.Chain)
	list := m.nest(unix.NFTA_RULE_EXPRESSIONS)
	proto, err := encodeTo(f, *r, wire{m})
	if err != nil {
		return fmt.Errorf("%s rule %q: %w", f, r.Rule().String(), err)
	}
	m.unnest(list)
	compat := m.nest(unix.NFTA_RULE_COMPAT)
	m.u32(unix.NFTA_RULE_COMPAT_PROTO, proto)
	m.u32(unix.NFTA_RULE_COMPAT_FLAGS, 0)
	m.unnest(compat)
	m.endWhat(what{rule: r, fam: fam})
	return nil
}

func deleteRule(m *msgs, fam byte, chain string, handle uint64) {
	m.beginNFT(unix.NFT_MSG_DELRULE, unix.NLM_F_REQUEST, fam)
	m.str(unix.NFTA_RULE_TABLE, iptables.Table)
	m.str(unix.NFTA_RULE_CHAIN, chain)
	m.u64(unix.NFTA_RULE_HANDLE, handle)
	m.endWhat(what{del: true, text: fmt.Sprintf("delete rule handle %d from %s %s %s", handle, famName(fam), iptables.Table, chain)})
}

// flush deletes every rule of a chain: a rule deletion that names no handle.
func flush(m *msgs, fam byte, chain string) {
	m.beginNFT(unix.NFT_MSG_DELRULE, unix.NLM_F_REQUEST, fam)
	m.str(unix.NFTA_RULE_TABLE, iptables.Table)
	m.str(unix.NFTA_RULE_CHAIN, chain)
	m.endWhat(what{del: true, text: fmt.Sprintf("flush chain %s %s %s", famName(fam), iptables.Table, chain)})
}

// sameRules reports whether a chain holds exactly the wanted rules, in order.
func sameRules(f iptables.Family, want []iptables.XTRule, have []rule) bool {
	if len(want) != len(have) {
		return false
	}
	for i := range want {
		e, err := encode(f, want[i])
		if err != nil || have[i].foreign != "" || !sameExprs(f, e.exprs, have[i].exprs) {
			return false
		}
	}
	return true
}

func (r rule) decode(f iptables.Family, chain string) (iptables.XTRule, bool) {
	if r.foreign != "" {
		return iptables.XTRule{}, false
	}
	return decode(f, chain, r.exprs)
}

func famName(fam byte) string {
	if fam == unix.NFPROTO_IPV6 {
		return "ip6"
	}
	return "ip"
}
