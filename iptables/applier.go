package iptables

// The Applier is the seam between this builder and the backends in its sub-packages. It is
// declared here, with the types it returns, so the backends and the selector in iptables/backend
// can all use it without import cycles. Declaring it keeps this package pure: nothing here runs.

import "context"

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
}

// FamilyState is one family's rules in the backend's own syntax (iptables-save lines, or nft
// statements) and the difference from what was expected.
type FamilyState struct {
	Family Family
	Rules  []string
	Diff   Diff
}

// Match reports whether every family's rules are exactly the expected ones.
func (s State) Match() bool {
	for _, f := range s.Families {
		if !f.Diff.Empty() {
			return false
		}
	}
	return true
}
