package iptables

// The Applier is the seam between this builder and the backends in its sub-packages, declared
// here so that they and the selector (iptables/runner) share it without import cycles.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Backend names a place where rules of ours can live: iptables-legacy's x_tables, iptables-nft's
// tables (written by its binaries or our netlink writer), or the native "inet proxy_init" table.
type Backend string

const (
	BackendLegacy   Backend = "iptables-legacy"
	BackendNFT      Backend = "iptables-nft"
	BackendNFTables Backend = "nftables"
)

// Applier writes, reads back and removes one backend's rules in the current network namespace.
// Callers enter the namespace first (internal/netnsutil).
type Applier interface {
	// Name is what logs and `show` call the applier: "iptables-legacy", "iptables-nft",
	// "iptables" or "nftables".
	Name() string
	// Covers lists the backends the applier works on: first the one Apply writes, then any
	// whose rules of ours Apply and Cleanup remove, and Show and Present report, with it. An
	// applier that decides by trying (runner.Fallback) knows it once it has tried.
	Covers() []Backend
	// Apply makes the rules in place exactly rs, atomically per family (or for both at once),
	// writing nothing when they already are; a failing family rolls back the earlier ones.
	Apply(ctx context.Context, rs *Ruleset) (Result, error)
	// Show reads back the rules in place and compares them with rs (others' in State.Elsewhere).
	Show(ctx context.Context, rs *Ruleset) (State, error)
	// Present lists what of ours each backend it covers holds (none: nothing to remove).
	Present(ctx context.Context) ([]Elsewhere, error)
	// Cleanup removes every rule and chain of ours from the backends it covers, and nothing else.
	Cleanup(ctx context.Context) error
}

// Result says what Apply did.
type Result struct {
	// Changed is false when the rules already matched and nothing was written.
	Changed bool
	// Note explains, for the log, a choice the applier made: which backend wrote when the
	// preferred one could not, and why.
	Note string
}

// State is the rules of ours in place, per family, and how they differ from the expected ones.
type State struct {
	Backend string
	// PerFamily is set when the backend writes one transaction per family (as Holding's).
	PerFamily bool
	Families  []FamilyState
	// Elsewhere lists rules of ours that other backends hold: leftovers of a run in another mode.
	Elsewhere []Elsewhere
	// Sysctls are the settings the plan sets besides rules, read back.
	Sysctls []SysctlState
	// Routes is the policy routing of ours in place (PolicyRoute.Lines) and its difference from
	// the plan's; nil when the plan has none and none is in place.
	Routes *RouteState `json:",omitempty"`
}

// RouteState is the policy routing read back: the lines in place, and the difference.
type RouteState struct {
	Lines []string
	Diff  Diff
}

// CompareRoutes compares the policy routing in place (as PolicyRoute.Lines) with want's; nil when
// neither holds any.
func CompareRoutes(want []PolicyRoute, have []string) *RouteState {
	var w []string
	for _, p := range want {
		w = append(w, p.Lines()...)
	}
	if len(w) == 0 && len(have) == 0 {
		return nil
	}
	return &RouteState{Lines: have, Diff: diffLines(w, have)}
}

// Elsewhere is what of ours one backend holds, when another is the one in use.
type Elsewhere struct {
	Backend Backend
	Rules   []string
}

// SysctlState is one setting read back: its file, the value wanted and the value in place.
type SysctlState struct {
	File, Want, Have string
}

// Match reports whether the setting has the wanted value.
func (s SysctlState) Match() bool { return s.Have == s.Want }

// HalfApplied describes, in a backend written per family, a family with every expected rule
// beside an expected one with none: what a writer killed between the two leaves. "" otherwise.
func (s State) HalfApplied() string {
	complete, empty := s.familyGap()
	if !s.PerFamily || complete == "" {
		return ""
	}
	return fmt.Sprintf("half-applied: %s has every rule but %s has none; a run was stopped between the two families' transactions: apply again to complete it", complete, empty)
}

// WrittenWithout explains the state HalfApplied describes in a backend that writes both families
// in one transaction, where no run was cut short. "" otherwise.
func (s State) WrittenWithout() string {
	complete, empty := s.familyGap()
	if s.PerFamily || complete == "" {
		return ""
	}
	return fmt.Sprintf("%s has every rule but %s has none: no run was cut short (%s writes both families in one transaction): they were written without %s, or removed since; apply again to write them",
		complete, empty, s.Backend, empty)
}

// familyGap names the families with every expected rule and those expected with none, if both.
func (s State) familyGap() (complete, empty string) {
	var c, e []string
	for _, f := range s.Families {
		switch {
		case f.Diff.Empty() && len(f.Rules) > 0:
			c = append(c, string(f.Family))
		case len(f.Rules) == 0 && len(f.Diff.Missing) > 0:
			e = append(e, string(f.Family))
		}
	}
	if len(c) == 0 || len(e) == 0 {
		return "", ""
	}
	return strings.Join(c, ", "), strings.Join(e, ", ")
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
	return !slices.ContainsFunc(s.Families, func(f FamilyState) bool { return !f.Diff.Empty() }) &&
		!slices.ContainsFunc(s.Sysctls, func(c SysctlState) bool { return !c.Match() }) &&
		(s.Routes == nil || s.Routes.Diff.Empty()) && len(s.Elsewhere) == 0
}

// ErrUnsupported marks a backend's error as the kernel lacking what it needs (nf_tables, an
// expression, an extension): the one case where another backend may work where it cannot.
var ErrUnsupported = errors.New("the kernel does not support this backend")

// ErrNotInKernel marks a backend whose kernel interface is refused outright: the nf_tables netlink
// socket cannot be opened (no nf_tables, a sandbox runtime, qemu-user). It is an ErrUnsupported;
// as nothing could have written rules there, reading and removing them find nothing, not fail.
var ErrNotInKernel error = notInKernel{}

type notInKernel struct{}

func (notInKernel) Error() string        { return "the kernel offers no interface for this backend" }
func (notInKernel) Is(target error) bool { return target == ErrUnsupported }

// CapabilityError is a backend refused by the kernel for want of a capability in the network
// namespace: callers can say what to grant, and the selector never takes it for ErrUnsupported.
type CapabilityError struct {
	// Caps are the capabilities the backend needs, e.g. "CAP_NET_ADMIN".
	Caps []string
	// NetNS names the network namespace, e.g. "net:[4026532281]".
	NetNS string
	// Op is what was refused, e.g. "read the nf_tables ruleset".
	Op  string
	Err error
}

func (e *CapabilityError) Error() string {
	caps := strings.Join(e.Caps, " and ")
	// A pod's securityContext names them without the prefix: NET_ADMIN.
	return fmt.Sprintf("%s: permission denied: this needs %s in network namespace %s (grant the container %s): %v",
		e.Op, caps, e.NetNS, strings.ReplaceAll(caps, "CAP_", ""), e.Err)
}

func (e *CapabilityError) Unwrap() error { return e.Err }

// IsCapabilityError reports whether err is, or wraps, a *CapabilityError.
func IsCapabilityError(err error) bool {
	var c *CapabilityError
	return errors.As(err, &c)
}
