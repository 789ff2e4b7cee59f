package iptables

import (
	"fmt"
	"slices"
	"strings"
)

// SavedState is what iptables-save shows of ours in the nat table of one family.
type SavedState struct {
	// Chains are our chains that exist, whether or not they hold rules.
	Chains []string
	// Rules are the lines inside our chains, and the lines anywhere that jump to them with one
	// of our comments, in iptables-save order.
	Rules []string
	// ForeignJumps are other lines that jump to our chains: someone's own rules, which an apply
	// keeps and only a cleanup (which removes the chains they point to) deletes.
	ForeignJumps []string
}

// Present lists what of ours the state holds in family f, each prefixed with f: the chains, the
// rules and someone else's jumps into our chains, i.e. what a cleanup removes.
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

// Jumps returns the saved rules of ours that jump into our chains from other chains, parsed back
// into Rules so they can be deleted exactly as they are.
func (s SavedState) Jumps() []Rule {
	var out []Rule
	for _, l := range s.Rules {
		if r := savedRule(l); !IsOurChain(r.Chain) {
			out = append(out, r)
		}
	}
	return out
}

// savedRule parses an iptables-save "-A <chain> <spec>" line back into a Rule.
func savedRule(line string) Rule {
	chain, spec, _ := strings.Cut(strings.TrimPrefix(line, "-A "), " ")
	return Rule{Chain: chain, Spec: spec}
}

// IsOurChain reports whether a chain of that name is one of ours (in either rendering).
func IsOurChain(c string) bool { return c == RedirectChain || c == OutputChain }

// ParseSave extracts our chains and rules from iptables-save output (any tables; only nat is read).
func ParseSave(save string) SavedState {
	var s SavedState
	inNat := false
	for _, l := range strings.Split(save, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, "*"):
			inNat = l == "*"+Table
		case !inNat:
		case strings.HasPrefix(l, ":"):
			name, _, _ := strings.Cut(l[1:], " ")
			if IsOurChain(name) {
				s.Chains = append(s.Chains, name)
			}
		case strings.HasPrefix(l, "-A "):
			chain, _, _ := strings.Cut(l[3:], " ")
			jump := strings.HasSuffix(l, " -j "+RedirectChain) || strings.HasSuffix(l, " -j "+OutputChain)
			switch {
			case IsOurChain(chain) || jump && strings.Contains(l, ` --comment "`+CommentPrefix):
				s.Rules = append(s.Rules, l)
			case jump:
				s.ForeignJumps = append(s.ForeignJumps, l)
			}
		}
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

// FamilyState is what show reports of family f given the rules of ours in place: those rules,
// and their difference from r's (all of them extra when r writes nothing in f).
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

// TransitionPayload renders one iptables-restore --noflush transaction that takes our rules from
// the state now in place to the target state, touching nothing else. Applying a Ruleset is
// TransitionPayload(current, rs.Saved(f)); rolling back is the reverse; cleanup is a transition
// to the empty state.
//
// Our chains are declared, which flushes them, and refilled from target. Jumps of ours into them
// are deleted or added one by one, so a jump already in place is never removed and re-added (no
// gap) and duplicates left by older tools are removed. Someone else's jumps into our chains are
// kept, unless the target has no chains: then they go too, or the chains could not be deleted.
func TransitionPayload(current, target SavedState) string {
	rules := make([]Rule, len(target.Rules))
	for i, l := range target.Rules {
		rules[i] = savedRule(l)
	}
	return transition(current, len(target.Chains) > 0, rules)
}

// transition renders TransitionPayload for target rules in iptables-save order, jumps included;
// keepChains is false when the target has none of our chains.
func transition(current SavedState, keepChains bool, target []Rule) string {
	var b strings.Builder
	size := 256
	for _, rl := range target {
		size += len(rl.Chain) + len(rl.Spec) + 5
	}
	b.Grow(size)
	b.WriteString("*nat\n")
	b.WriteString(":" + RedirectChain + " - [0:0]\n")
	b.WriteString(":" + OutputChain + " - [0:0]\n")

	keep := map[string]int{}
	for _, j := range target {
		if !IsOurChain(j.Chain) {
			keep[j.String()]++
		}
	}
	if !keepChains {
		for _, l := range current.ForeignJumps {
			savedRule(l).writeTo(&b, "-D ")
		}
	}
	have := map[string]int{}
	for _, j := range current.Jumps() {
		if keep[j.String()] > have[j.String()] {
			have[j.String()]++
			continue
		}
		j.writeTo(&b, "-D ")
	}
	if !keepChains {
		b.WriteString("-X " + RedirectChain + "\n")
		b.WriteString("-X " + OutputChain + "\n")
	}
	for _, rl := range target {
		if IsOurChain(rl.Chain) {
			rl.writeTo(&b, "-A ")
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
		j.writeTo(&b, "-A ")
	}
	b.WriteString("COMMIT\n")
	return b.String()
}

// CleanupPayload is the iptables-restore --noflush transaction that removes our chains and our
// jumps to them, as they are after an apply: what `cleanup --simulate` shows. (Cleanup itself
// transitions from the state it reads back, which may hold more.)
func CleanupPayload() string {
	applied := SavedState{Chains: []string{OutputChain, RedirectChain}}
	for _, j := range XTJumps() {
		applied.Rules = append(applied.Rules, j.Rule().String())
	}
	return TransitionPayload(applied, SavedState{})
}
