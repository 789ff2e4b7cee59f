package iptablestest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/kubemesh/proxy-init/iptables"
)

// Fake is an iptables.Applier that keeps the rules in memory, as the iptables backends would list
// them (Ruleset.Saved), so that the callers' policy (what ADD, CHECK and DEL do with a mismatch or a
// failure) can be tested without root. Dump renders what it holds deterministically; Set and Fail
// let a test tamper with the rules or make an operation fail. It is safe for concurrent use.
type Fake struct {
	mu    sync.Mutex
	rules map[iptables.Family][]string
	fail  map[string]error
	calls map[string]int
}

var _ iptables.Applier = (*Fake)(nil)

// NewFake returns a Fake holding no rules.
func NewFake() *Fake {
	return &Fake{rules: map[iptables.Family][]string{}, fail: map[string]error{}, calls: map[string]int{}}
}

// Name returns "fake".
func (f *Fake) Name() string { return "fake" }

// Covers names the fake as the one backend it holds.
func (f *Fake) Covers() []iptables.Backend { return []iptables.Backend{"fake"} }

// Fail makes every later call of op ("apply", "show", "present" or "cleanup") return err; nil clears it.
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
func (f *Fake) Set(fam iptables.Family, rules []string) {
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
func (f *Fake) Apply(_ context.Context, rs *iptables.Ruleset) (iptables.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("apply"); err != nil {
		return iptables.Result{}, err
	}
	var res iptables.Result
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		want := rs.Saved(fam).Rules
		if !slices.Equal(f.rules[fam], want) {
			res.Changed = true
			f.rules[fam] = want
		}
	}
	return res, nil
}

// Show compares the rules held with rs's, like the iptables backends.
func (f *Fake) Show(_ context.Context, rs *iptables.Ruleset) (iptables.State, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("show"); err != nil {
		return iptables.State{}, err
	}
	st := iptables.State{Backend: f.Name()}
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		st.Families = append(st.Families, rs.FamilyState(fam, iptables.SavedState{Rules: slices.Clone(f.rules[fam])}))
	}
	return st, nil
}

// Present lists the rules held, as Show does, under the fake's name.
func (f *Fake) Present(context.Context) ([]iptables.Elsewhere, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("present"); err != nil {
		return nil, err
	}
	var lines []string
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		lines = append(lines, f.rules[fam]...)
	}
	if len(lines) == 0 {
		return nil, nil
	}
	return []iptables.Elsewhere{{Backend: "fake", Rules: lines}}, nil
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
	for _, fam := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		fmt.Fprintf(&b, "# %s\n", fam)
		for _, l := range f.rules[fam] {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}
