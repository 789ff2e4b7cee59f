package iptables

// The Applier is the seam between this builder and the backends in its sub-packages. It is
// declared here, with the types it returns, so the backends and the selector in iptables/backend
// can all use it without import cycles. Declaring it keeps this package pure: nothing here runs.

import (
	"context"
	"fmt"
	"strings"
)

// Applier writes, reads back and removes one backend's rules in the current network namespace.
// Callers enter the namespace first (internal/netnsutil).
type Applier interface {
	// Name is what logs and `show` call the backend: "iptables-legacy", "iptables-nft",
	// "iptables" or "nftables".
	Name() string
	// Apply makes the rules in place exactly rs, atomically per family (or for both families at
	// once), and writes nothing when they already are. If a later family fails, earlier ones are
	// restored to what they were.
	Apply(ctx context.Context, rs *Ruleset) (Result, error)
	// Show reads back the rules in place and compares them with rs.
	Show(ctx context.Context, rs *Ruleset) (State, error)
	// Cleanup removes every rule and chain of ours, and nothing else. It succeeds when there is
	// nothing to remove.
	Cleanup(ctx context.Context) error
}

// Result says what Apply did.
type Result struct {
	// Changed is false when the rules already matched and nothing was written.
	Changed bool
}

// State is the rules of ours in place, per family, and how they differ from the expected ones.
type State struct {
	Backend  string
	Families []FamilyState
	// Elsewhere lists rules of ours that backends other than Backend hold: leftovers of an
	// earlier run in another mode, which should not exist.
	Elsewhere []Elsewhere
	// Sysctls are the settings the plan sets besides rules, read back.
	Sysctls []SysctlState
}

// Elsewhere is what of ours another backend holds.
type Elsewhere struct {
	Backend string
	Rules   []string
}

// SysctlState is one setting read back: its file, the value wanted and the value in place.
type SysctlState struct {
	File, Want, Have string
}

// Match reports whether the setting has the wanted value.
func (s SysctlState) Match() bool { return s.Have == s.Want }

// HalfApplied describes a state where some family has every expected rule and another, also
// expected, has none of ours: what a writer killed between the two families' transactions leaves
// (only the iptables binaries write the families separately). It is "" otherwise. Re-running
// the apply completes it.
func (s State) HalfApplied() string {
	var complete, empty []string
	for _, f := range s.Families {
		switch {
		case f.Diff.Empty() && len(f.Rules) > 0:
			complete = append(complete, string(f.Family))
		case len(f.Rules) == 0 && len(f.Diff.Missing) > 0:
			empty = append(empty, string(f.Family))
		}
	}
	if len(complete) == 0 || len(empty) == 0 {
		return ""
	}
	return fmt.Sprintf("half-applied: %s has every rule but %s has none; a run was stopped between the two families' transactions: apply again to complete it",
		strings.Join(complete, ", "), strings.Join(empty, ", "))
}

// FamilyState is one family's rules in the backend's own syntax (iptables-save lines, or nft
// statements) and the difference from what was expected.
type FamilyState struct {
	Family Family
	Rules  []string
	Diff   Diff
}

// Match reports whether every family's rules are exactly the expected ones, no other backend
// holds rules of ours, and every setting has its value.
func (s State) Match() bool {
	for _, f := range s.Families {
		if !f.Diff.Empty() {
			return false
		}
	}
	for _, c := range s.Sysctls {
		if !c.Match() {
			return false
		}
	}
	return len(s.Elsewhere) == 0
}
