package iptables

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// Fake is an Applier that keeps the rules in memory, as the iptables backends would list them
// (Ruleset.Saved), so that the callers' policy (what ADD, CHECK and DEL do with a mismatch or a
// failure) can be tested without root. Dump renders what it holds deterministically; Set and Fail
// let a test tamper with the rules or make an operation fail. It is safe for concurrent use.
type Fake struct {
	mu    sync.Mutex
	rules map[Family][]string
	fail  map[string]error
	calls map[string]int
}

var _ Applier = (*Fake)(nil)

// NewFake returns a Fake holding no rules.
func NewFake() *Fake {
	return &Fake{rules: map[Family][]string{}, fail: map[string]error{}, calls: map[string]int{}}
}

// Name returns "fake".
func (f *Fake) Name() string { return "fake" }

// Fail makes every later call of op ("apply", "show" or "cleanup") return err; nil clears it.
func (f *Fake) Fail(op string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail[op] = err
}

// Calls returns how many times op was called, failed calls included.
func (f *Fake) Calls(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Set replaces the rules of family fam, as if someone had edited them.
func (f *Fake) Set(fam Family, rules []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rules[fam] = slices.Clone(rules)
}

// call counts op and returns its configured failure.
func (f *Fake) call(op string) error {
	f.calls[op]++
	return f.fail[op]
}

// Apply makes the rules exactly rs's, reporting whether anything changed.
func (f *Fake) Apply(_ context.Context, rs *Ruleset) (Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("apply"); err != nil {
		return Result{}, err
	}
	var res Result
	for _, fam := range []Family{IPv4, IPv6} {
		var want []string
		if rs.HasFamily(fam) {
			want = rs.Saved(fam).Rules
		}
		if !slices.Equal(f.rules[fam], want) {
			res.Changed = true
			f.rules[fam] = want
		}
	}
	return res, nil
}

// Show compares the rules held with rs's, like the iptables backends.
func (f *Fake) Show(_ context.Context, rs *Ruleset) (State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("show"); err != nil {
		return State{}, err
	}
	st := State{Backend: f.Name()}
	for _, fam := range []Family{IPv4, IPv6} {
		st.Families = append(st.Families, rs.FamilyState(fam, SavedState{Rules: slices.Clone(f.rules[fam])}))
	}
	return st, nil
}

// Cleanup removes every rule held.
func (f *Fake) Cleanup(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("cleanup"); err != nil {
		return err
	}
	clear(f.rules)
	return nil
}

// Dump renders the rules held, family by family, in a stable form for assertions and golden
// files: "# ipv4" then its rules, then "# ipv6" and its rules.
func (f *Fake) Dump() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	for _, fam := range []Family{IPv4, IPv6} {
		fmt.Fprintf(&b, "# %s\n", fam)
		for _, l := range f.rules[fam] {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
