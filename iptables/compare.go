package iptables

import (
	"fmt"
	"slices"
	"strings"
)

// SavedState is what iptables-save shows of ours in one family, in the nat, mangle and raw tables.
type SavedState struct {
	// Chains are our chains that exist, table by table (XTTables), by name within a table.
	Chains []string
	// Rules are the lines inside our chains and our commented jumps to them, in iptables-save
	// order, table by table, as Rule.String renders them.
	Rules []string
	// ForeignJumps are someone else's jumps to our chains, which only a cleanup deletes.
	ForeignJumps []string
}

// Present lists what a cleanup removes from family f, each line prefixed with f.
func (s SavedState) Present(f Family) []string {
	var out []string
	for _, c := range s.Chains {
		out = append(out, fmt.Sprintf("%s: chain %s", f, c))
	}
	for _, l := range append(slices.Clone(s.Rules), s.ForeignJumps...) {
		out = append(out, fmt.Sprintf("%s: %s", f, l))
	}
	return out
}

// Empty reports whether nothing of ours is present.
func (s SavedState) Empty() bool {
	return len(s.Chains) == 0 && len(s.Rules) == 0 && len(s.ForeignJumps) == 0
}

// Tables lists the tables the state holds anything of ours in, in XTTables order.
func (s SavedState) Tables() []string {
	var out []string
	lines := append(slices.Clone(s.Rules), s.ForeignJumps...)
	for _, t := range XTTables() {
		if slices.ContainsFunc(s.Chains, func(c string) bool { return ChainTable(c) == t.Name }) ||
			slices.ContainsFunc(lines, func(l string) bool { return savedRule(l).Table == t.Name }) {
			out = append(out, t.Name)
		}
	}
	return out
}

// savedRule parses a line as Rule.String renders it ("[-t <table> ]-A <chain> <spec>").
func savedRule(line string) Rule {
	r := Rule{Table: Table}
	if rest, ok := strings.CutPrefix(line, "-t "); ok {
		r.Table, line, _ = strings.Cut(rest, " ")
	}
	r.Chain, r.Spec, _ = strings.Cut(strings.TrimPrefix(line, "-A "), " ")
	return r
}

// rulesIn parses those of lines (as Rule.String renders them) that are in table t.
func rulesIn(t XTTable, lines []string) []Rule {
	var out []Rule
	for _, l := range lines {
		if r := savedRule(l); r.Table == t.Name {
			out = append(out, r)
		}
	}
	return out
}

// jumpTarget is what a rule line ends in "-j X" with: for a jump, the chain it enters.
func jumpTarget(line string) string {
	if i := strings.LastIndex(line, "-j "); i >= 0 {
		return line[i+3:]
	}
	return ""
}

// IsOurChain reports whether a chain of that name is one of ours (in either rendering).
func IsOurChain(c string) bool { return ChainTable(c) != "" }

// ChainTable is the table our chain of that name lives in, or "" for a name not ours.
func ChainTable(name string) string {
	for _, c := range ourChains {
		if c.Name == name {
			return c.Table.Name
		}
	}
	return ""
}

// ParseSave extracts our chains and rules from iptables-save output of any tables, in
// SavedState's order whatever the output's.
func ParseSave(save string) SavedState {
	tables := XTTables()
	per := make([]SavedState, len(tables)) // in XTTables order
	var cur *SavedState
	table := ""
	for _, l := range strings.Split(save, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "*"):
			table, cur = l[1:], nil
			if i := slices.IndexFunc(tables, func(t XTTable) bool { return t.Name == table }); i >= 0 {
				cur = &per[i]
			}
		case cur == nil:
		case strings.HasPrefix(l, ":"):
			name, _, _ := strings.Cut(l[1:], " ")
			if ChainTable(name) == table {
				cur.Chains = append(cur.Chains, name)
			}
		case strings.HasPrefix(l, "-A "):
			chain, _, _ := strings.Cut(l[3:], " ")
			jump := ChainTable(jumpTarget(l)) == table
			if table != Table {
				l = "-t " + table + " " + l
			}
			switch {
			case ChainTable(chain) == table || jump && strings.Contains(l, ` --comment "`+CommentPrefix):
				cur.Rules = append(cur.Rules, l)
			case jump:
				cur.ForeignJumps = append(cur.ForeignJumps, l)
			}
		}
	}
	var s SavedState
	for _, p := range per {
		s.Chains = append(s.Chains, p.Chains...)
		s.Rules = append(s.Rules, p.Rules...)
		s.ForeignJumps = append(s.ForeignJumps, p.ForeignJumps...)
	}
	return s
}

// Diff is the difference between the rules a Ruleset expects and the rules in place.
type Diff struct {
	Missing []string // expected, not present
	Extra   []string // present, not expected (including duplicates)
	// Reordered is set when the same rules are present in a different order.
	Reordered bool
}

// Empty reports whether the rules in place are exactly the expected ones.
func (d Diff) Empty() bool { return len(d.Missing) == 0 && len(d.Extra) == 0 && !d.Reordered }

func (d Diff) String() string {
	if d.Empty() {
		return "rules match"
	}
	var parts []string
	for _, m := range d.Missing {
		parts = append(parts, "missing: "+m)
	}
	for _, e := range d.Extra {
		parts = append(parts, "extra: "+e)
	}
	if d.Reordered {
		parts = append(parts, "rules are in the wrong order")
	}
	return strings.Join(parts, "\n")
}

// FamilyState is what show reports of family f: our rules in place and their difference from r's.
func (r *Ruleset) FamilyState(f Family, in SavedState) FamilyState {
	return FamilyState{Family: f, Rules: in.Rules, Diff: r.Compare(f, in)}
}

// Compare checks the rules in place for family f against the expected ones (none, when r does not
// write f). Order matters within a chain, because the first matching RETURN or REDIRECT wins.
func (r *Ruleset) Compare(f Family, s SavedState) Diff {
	return diffLines(r.Saved(f).Rules, s.Rules)
}

func diffLines(want, have []string) Diff {
	var d Diff
	count := map[string]int{}
	for _, l := range have {
		count[l]++
	}
	for _, l := range want {
		if count[l] > 0 {
			count[l]--
		} else {
			d.Missing = append(d.Missing, l)
		}
	}
	for _, l := range have {
		if count[l] > 0 {
			count[l]--
			d.Extra = append(d.Extra, l)
		}
	}
	if len(d.Missing) == 0 && len(d.Extra) == 0 && !slices.Equal(want, have) {
		d.Reordered = true
	}
	return d
}

// TransitionPayload renders one iptables-restore --noflush input that takes our rules from the
// state in place to target, touching nothing else: a transaction per table (nat always, mangle
// and raw where either state has something of ours). Cleanup is a transition to the empty state.
//
// Our chains are declared, which flushes them, and refilled. Our jumps into them are deleted or
// added one by one, so a jump in place is never removed and re-added (no gap) and duplicates go.
// Someone else's jumps are kept, unless their chain goes, which they would keep from deletion.
func TransitionPayload(current, target SavedState) string {
	var b strings.Builder
	size := 256
	for _, l := range target.Rules {
		size += len(l) + 1
	}
	b.Grow(size)
	for _, t := range XTTables() {
		transition(&b, t, current, target.Chains, rulesIn(t, target.Rules))
	}
	return b.String()
}

// transition writes the transaction of table t: current is the whole state in place, chains the
// target's chains and target its rules of t, in iptables-save order, jumps included.
func transition(b *strings.Builder, t XTTable, current SavedState, chains []string, target []Rule) {
	var declare []string
	for _, c := range Chains() {
		// Linkerd's two are declared whatever the states hold, as they always were.
		either := slices.Contains(chains, c.Name) || slices.Contains(current.Chains, c.Name)
		if c.Table == t && (either || t == TableNAT) {
			declare = append(declare, c.Name)
		}
	}
	// Our jumps in place, parsed back to be deleted exactly as they are, and someone else's.
	curJumps := slices.DeleteFunc(rulesIn(t, current.Rules), func(r Rule) bool {
		return IsOurChain(r.Chain)
	})
	foreign := rulesIn(t, current.ForeignJumps)
	if t != TableNAT && len(declare) == 0 && len(curJumps) == 0 && len(foreign) == 0 {
		return
	}
	b.WriteString("*" + t.Name + "\n")
	for _, c := range declare {
		b.WriteString(":" + c + " - [0:0]\n")
	}
	want := map[string]int{}
	for _, j := range target {
		if !IsOurChain(j.Chain) {
			want[j.String()]++
		}
	}
	for _, r := range foreign {
		if !slices.Contains(chains, jumpTarget(r.Spec)) {
			r.writeTo(b, "-D ")
		}
	}
	have := map[string]int{}
	for _, j := range curJumps {
		if want[j.String()] > have[j.String()] {
			have[j.String()]++
			continue
		}
		j.writeTo(b, "-D ")
	}
	for _, c := range declare {
		if !slices.Contains(chains, c) {
			b.WriteString("-X " + c + "\n")
		}
	}
	for _, rl := range target {
		if IsOurChain(rl.Chain) {
			rl.writeTo(b, "-A ")
		}
	}
	for _, j := range target {
		if IsOurChain(j.Chain) {
			continue
		}
		if have[j.String()] > 0 {
			have[j.String()]--
			continue
		}
		j.writeTo(b, "-A ")
	}
	b.WriteString("COMMIT\n")
}

// CleanupPayload is the transaction that removes our chains and jumps as an apply of Linkerd's
// configuration leaves them: what `cleanup --simulate` shows.
func CleanupPayload() string {
	applied := SavedState{Chains: []string{OutputChain, RedirectChain}}
	for _, j := range xtJumps(Chains()) {
		if j.TableName() == Table {
			applied.Rules = append(applied.Rules, j.Rule().String())
		}
	}
	return TransitionPayload(applied, SavedState{})
}
