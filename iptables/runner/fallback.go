package runner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kubemesh/proxy-init/iptables"
)

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
