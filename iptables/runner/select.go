// Package runner holds the Runner, the one path from a ruleset to a namespace (enter, lock, choose
// the backend, write or read or remove, clear the other backends, set the close-wait sysctl), and
// the choice of the applier for a mode. Which rules exist is package iptables' business.
//
// # Tests
//
// As root: real TCP through every backend, backend switches, cleanup, concurrency, half-applied
// states, close-wait, the real fallbacks and foreign user namespaces. Without root: the fallback
// order over fake appliers.
package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/nfnl"
	"github.com/kubemesh/proxy-init/iptables/xtables"
)

// Options choose and configure a backend.
type Options struct {
	Mode iptables.Mode
	// Wait makes the iptables binaries wait for the xtables lock (at most xtables.WaitTimeout).
	Wait bool
}

// The two netlink writers: each covers both representations, so its batch clears the other.
var (
	netlinkXT     = try{"iptables-nft over netlink", func() (iptables.Applier, error) { return nfnl.New(iptables.BackendNFT, iptables.BackendNFTables), nil }}
	netlinkNative = try{"native nftables", func() (iptables.Applier, error) { return nfnl.New(iptables.BackendNFTables, iptables.BackendNFT), nil }}
)

// New returns the applier for opts.Mode and why, for the log; nft and auto decide by writing.
func New(opts Options) (iptables.Applier, string, error) {
	xo := xtables.Options{Wait: opts.Wait}
	binaries := func(m iptables.Mode) func() (iptables.Applier, error) {
		return func() (iptables.Applier, error) {
			a, err := xtables.New(m, xo)
			if err != nil {
				return nil, err
			}
			return a, nil
		}
	}
	switch opts.Mode {
	case iptables.ModePlain:
		// Plain iptables on nf_tables writes iptables-nft's rules, as the netlink writer does.
		if f, err := xtables.DetectPlain(); err == nil && f == iptables.BackendNFT {
			return &Fallback{tries: []try{netlinkXT, {"the iptables binaries", binaries(iptables.ModePlain)}}},
				"--iptables-mode=plain, and the iptables binaries drive nf_tables: their rules written over netlink, or by the binaries where the kernel refuses that", nil
		}
		fallthrough
	case iptables.ModeLegacy:
		a, err := binaries(opts.Mode)()
		return a, fmt.Sprintf("--iptables-mode=%s asks for it", opts.Mode), err
	case iptables.ModeNFT:
		return &Fallback{tries: []try{netlinkXT, {"the iptables-nft binaries", binaries(iptables.ModeNFT)}}},
			"--iptables-mode=nft asks for iptables-nft's rules: written over netlink, or by the iptables-nft binaries where the kernel refuses that", nil
	case iptables.ModeNFTables:
		a, _ := netlinkNative.new()
		return a, "--iptables-mode=nftables asks for it", nil
	case iptables.ModeAuto, "":
		return &Fallback{tries: []try{netlinkXT, netlinkNative, {"iptables-legacy", binaries(iptables.ModeLegacy)}}},
			"auto: the first the kernel accepts of iptables-nft's rules over netlink (what `iptables -t nat -S` shows), the native nftables table, iptables-legacy", nil
	}
	return nil, "", fmt.Errorf("iptables mode %q has no backend", opts.Mode)
}

// Fallback is the applier of the modes that decide by trying: it writes with the first of its
// backends the kernel accepts. Trying is the real write, not a probe, so the preferred backend
// costs what it costs when named. A backend is passed over only when its binaries are missing or
// the kernel lacks what it needs (iptables.ErrUnsupported); any other failure (a missing
// capability, a cancelled context) stops the search rather than hide behind another backend.
type Fallback struct {
	tries  []try
	chosen iptables.Applier
}

// try is one backend of a Fallback, built only when it is reached.
type try struct {
	what string // how notes and errors call it, e.g. "iptables-nft over netlink"
	new  func() (iptables.Applier, error)
}

// Name is the name of the backend that wrote, once one has; before, the first one's.
func (f *Fallback) Name() string {
	if f.chosen != nil {
		return f.chosen.Name()
	}
	a, err := f.tries[0].new()
	if err != nil {
		return f.tries[0].what
	}
	return a.Name()
}

// Covers is what the backend that wrote or read last covers; nothing before one has.
func (f *Fallback) Covers() []iptables.Backend {
	if f.chosen == nil {
		return nil
	}
	return f.chosen.Covers()
}

// passedOver reports whether err lets the search go on to the next backend.
func passedOver(err error) bool {
	return !iptables.IsCapabilityError(err) && errors.Is(err, iptables.ErrUnsupported)
}

// first calls fn with each backend until one succeeds or stops the search; it says why it passed.
func (f *Fallback) first(fn func(a iptables.Applier) error) ([]string, error) {
	var passed []string
	for _, t := range f.tries {
		a, err := t.new()
		if err == nil {
			if err = fn(a); err == nil {
				f.chosen = a
				return passed, nil
			}
			if !passedOver(err) {
				return passed, withPassed(err, passed)
			}
		}
		passed = append(passed, fmt.Sprintf("%s: %v", t.what, err))
	}
	return passed, fmt.Errorf("no backend works here: %s", strings.Join(passed, "; "))
}

func withPassed(err error, passed []string) error {
	if len(passed) == 0 {
		return err
	}
	return fmt.Errorf("%w (after passing over %s)", err, strings.Join(passed, "; "))
}

// Apply writes with the first backend that works; Result.Note says why earlier ones did not.
func (f *Fallback) Apply(ctx context.Context, rs *iptables.Ruleset) (iptables.Result, error) {
	var res iptables.Result
	passed, err := f.first(func(a iptables.Applier) (err error) {
		res, err = a.Apply(ctx, rs)
		return err
	})
	if err != nil {
		return iptables.Result{}, err
	}
	if len(passed) > 0 {
		res.Note = fmt.Sprintf("%s wrote the rules; passed over %s", f.chosen.Name(), strings.Join(passed, "; "))
	}
	return res, nil
}

// Show reads with the first backend that holds rules of ours (any run's), else the first that can.
func (f *Fallback) Show(ctx context.Context, rs *iptables.Ruleset) (iptables.State, error) {
	var first *iptables.State
	var passed []string
	for _, t := range f.tries {
		a, err := t.new()
		var st iptables.State
		if err == nil {
			st, err = a.Show(ctx, rs)
		}
		switch {
		case err != nil && (iptables.IsCapabilityError(err) || a != nil && !passedOver(err)):
			return iptables.State{}, withPassed(err, passed)
		case err != nil:
			passed = append(passed, fmt.Sprintf("%s: %v", t.what, err))
		case slices.ContainsFunc(st.Families, func(fs iptables.FamilyState) bool {
			return len(fs.Rules) > 0 // holds rules of ours
		}):
			f.chosen = a
			return st, nil
		case first == nil:
			first, f.chosen = &st, a
		}
	}
	if first == nil {
		return iptables.State{}, fmt.Errorf("no backend can read here: %s", strings.Join(passed, "; "))
	}
	return *first, nil
}

// Present lists what of ours the first backend that can read finds.
func (f *Fallback) Present(ctx context.Context) ([]iptables.Elsewhere, error) {
	var es []iptables.Elsewhere
	_, err := f.first(func(a iptables.Applier) (err error) {
		es, err = a.Present(ctx)
		return err
	})
	return es, err
}

// Cleanup removes our rules with the first backend that works (the Runner does the others).
func (f *Fallback) Cleanup(ctx context.Context) error {
	_, err := f.first(func(a iptables.Applier) error { return a.Cleanup(ctx) })
	return err
}

// userNSReason is the backend choice's reason in a network namespace another user namespace owns
// (%s; a pod with hostUsers: false, seen from the host). The kernel refuses an xtables owner match
// (the proxy's exemption) with EINVAL unless the writer is in the namespace's owner, and a Go
// process cannot join another user namespace (setns(2) refuses CLONE_NEWUSER to a threaded
// process). Native nftables' meta skuid has no such check, so it is written in every mode there.
// Where the owner cannot be told (no /proc), the mode's own backend writes.
const userNSReason = "network namespace owned by user namespace %s (a pod with hostUsers: false): iptables' owner match is refused there from outside it; writing the native nftables table instead"

// Simulate renders what Apply (rs non-nil) or Cleanup (rs nil) would do in the target namespace,
// and changes nothing. The netlink writers show the batch they would send, planned from the state
// read under the shared lock, or, where it cannot be read, for a namespace holding nothing, saying
// why. The iptables binaries show their restore payloads for a namespace holding none of ours.
// Auto shows each of its choices; a foreign user namespace's network namespace, the native table.
func (r Runner) Simulate(ctx context.Context, t Target, rs *iptables.Ruleset) string {
	r = r.withDefaults()
	var pre string
	if userns, _ := netnsutil.ForeignUserNS(t.NetNS); userns != "" {
		t.Mode, pre = iptables.ModeNFTables, "# "+fmt.Sprintf(userNSReason, userns)+"\n"
	}
	if (t.Mode == iptables.ModeLegacy || t.Mode == iptables.ModePlain) && (rs == nil || !rs.IPv6Auto) {
		return simulation(t.Mode, rs, nil)
	}
	var out string
	err := r.Enter(t, false, func() error {
		rs := r.decideIPv6(t, rs) // the iptables binaries' simulation calls no plan
		out = simulation(t.Mode, rs, func(bs ...iptables.Backend) string { return nfnl.New(bs...).BatchFor(ctx, rs).String() })
		return nil
	})
	if err != nil {
		why := err.Error()
		if rs != nil && rs.IPv6Auto {
			why += "; ipv6=auto undecided, so both families are shown"
		}
		out = simulation(t.Mode, rs, func(bs ...iptables.Backend) string { return nfnl.New(bs...).PlanFresh(rs, why).String() })
	}
	return pre + out
}

// simulation renders Simulate's text; plan renders the batch of the writer covering backends.
func simulation(mode iptables.Mode, rs *iptables.Ruleset, plan func(backends ...iptables.Backend) string) string {
	var b strings.Builder
	netlink := func(title string, bs ...iptables.Backend) {
		b.WriteString("# " + title + "\n" + plan(bs...))
	}
	restores := func() {
		fams := []iptables.Family{iptables.IPv4, iptables.IPv6}
		if rs != nil {
			fams = rs.Families
		}
		for _, f := range fams {
			bin := cmp.Or(map[iptables.Family]string{iptables.IPv6: "ip6"}[f], "ip") + "tables-restore"
			fmt.Fprintf(&b, "# %s: %s --noflush\n", f, bin)
			if rs == nil {
				b.WriteString(iptables.CleanupPayload())
			} else {
				b.WriteString(iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f)))
			}
		}
	}
	switch mode {
	case iptables.ModeNFTables:
		netlink("nftables: the native table, over netlink", iptables.BackendNFTables, iptables.BackendNFT)
	case iptables.ModeNFT:
		netlink("nft: iptables-nft's rules over netlink (where the kernel refuses them, the iptables-nft binaries restore the same rules)",
			iptables.BackendNFT, iptables.BackendNFTables)
	case iptables.ModeAuto, "":
		b.WriteString("# auto chooses at run time, by writing: iptables-nft's rules over netlink, else the native\n")
		b.WriteString("# nftables table, else iptables-legacy; what each would do:\n")
		netlink("1. iptables-nft's rules over netlink", iptables.BackendNFT, iptables.BackendNFTables)
		netlink("2. where the kernel refuses those: the native nftables table", iptables.BackendNFTables, iptables.BackendNFT)
		b.WriteString("# 3. where it refuses both: iptables-legacy (for a namespace holding none of our rules)\n")
		restores()
	default:
		b.WriteString("# the iptables binaries, for a namespace holding none of our rules\n")
		restores()
	}
	if rs == nil {
		b.WriteString("# cleanup also removes rules of ours that any other backend holds, and the policy routing of ours\n")
		return b.String()
	}
	if routes := rs.PolicyRoutes(); len(routes) > 0 {
		b.WriteString("# and, over rtnetlink before the rules, the policy routing TPROXY needs (where missing):\n")
		for _, p := range routes {
			for _, l := range p.Lines() {
				b.WriteString("#   " + l + "\n")
			}
		}
	}
	if rs.CloseWaitSecs > 0 {
		// As setCloseWait does it: netlink first, the sysctl file only where the kernel refuses.
		fmt.Fprintf(&b, "# and set the namespace's conntrack close-wait timeout to %d s over netlink (cttimeout),\n", rs.CloseWaitSecs)
		fmt.Fprintf(&b, "# or, where the kernel refuses that, write %d to %s\n", rs.CloseWaitSecs, iptables.CloseWaitSysctl)
	}
	return b.String()
}
