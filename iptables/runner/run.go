package runner

// proxy-init and the CNI plugin both go through Runner, so they cannot differ in any step.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/conntrack"
	"github.com/kubemesh/proxy-init/iptables/nfnl"
	"github.com/kubemesh/proxy-init/iptables/routing"
	"github.com/kubemesh/proxy-init/iptables/xtables"
)

// Target is one namespace to work in, and how.
type Target struct {
	Options
	// NetNS is the namespace's path (/proc/PID/ns/net, /run/netns/NAME); "" is the process's.
	NetNS string
	// Log receives the backend choice and why, at ChoiceLevel (Info unless set); nil discards it.
	Log         *slog.Logger
	ChoiceLevel slog.Level
	// HostLockDir, when set, holds the namespace's host lock (lock.go); empty means the in-pod
	// lock alone. InPodLock then also takes the in-pod lock, after the host one.
	HostLockDir string
	InPodLock   bool
	// LockWait bounds the wait for the locks; 0 means DefaultLockWait.
	LockWait time.Duration
	// RemoveHostLock makes a Cleanup remove the host lock's file: the namespace is going (DEL).
	RemoveHostLock bool
}

func (t Target) log() *slog.Logger { return cmp.Or(t.Log, slog.New(slog.DiscardHandler)) }

// Outcome says what Apply did, for the caller's log line.
type Outcome struct {
	Backend string
	// Changed is false when the rules were already exactly right and nothing was written.
	Changed bool
}

// Runner runs the path. The zero Runner is the real one; tests replace its seams (nil means the
// real one) to run the same path against a fake applier without root.
type Runner struct {
	// Choose picks the applier for the options and says why (New).
	Choose func(Options) (iptables.Applier, string, error)
	// Others looks for and removes rules of ours in every backend but the covered ones.
	Others func(covered []iptables.Backend) []iptables.Applier
	// Enter runs fn inside the target's namespace holding the locks it asks for (enterLocked).
	Enter func(t Target, exclusive bool, fn func() error) error
	// CloseWaitFile, when set, is where the close-wait timeout is written and read (tests); empty
	// means over netlink, or iptables.CloseWaitSysctl where the kernel refuses that.
	CloseWaitFile string
	// Kernel says, after an apply failed, whether the kernel lacks what rs needs in mode.
	Kernel func(ctx context.Context, mode iptables.Mode, rs *iptables.Ruleset) error
	// Routing writes, reads back and removes the policy routing TPROXY needs (routing.Netlink).
	Routing Routing
	// IPv6 says whether the namespace has IPv6 to write rules for (ipv6=auto), and why.
	IPv6 func() (bool, string)
}

// Routing is the policy routing of the namespace the Runner is in: Read renders ours in place as
// iptables.PolicyRoute.Lines does, Ensure adds what of want is missing and returns what undoes
// exactly that, Prune removes ours that want does not hold.
type Routing interface {
	Read() ([]string, error)
	Ensure(want []iptables.PolicyRoute) (undo func() error, err error)
	Prune(want []iptables.PolicyRoute) error
}

// Apply writes rs into the target namespace, removes our rules from every other backend (after
// the new ones are in place, so redirection never stops), and sets the close-wait timeout when
// rs has one (after the rules: the nat rules load conntrack, which creates the sysctl).
func (r Runner) Apply(ctx context.Context, t Target, rs *iptables.Ruleset) (Outcome, error) {
	r = r.withDefaults()
	var out Outcome
	err := r.in(t, true, rs, func(a iptables.Applier, rs *iptables.Ruleset) error {
		// Policy routing first, so the first packet TPROXY marks has its route.
		undo, err := r.Routing.Ensure(rs.PolicyRoutes())
		if err != nil {
			return fmt.Errorf("add the policy routing TPROXY needs (nothing else was written): %w", err)
		}
		res, err := a.Apply(ctx, rs)
		if err != nil {
			err = fmt.Errorf("apply rules with %s: %w", a.Name(), err)
			if uerr := undo(); uerr != nil {
				return errors.Join(err, fmt.Errorf("and removing the policy routing added for them failed: %w", uerr))
			}
			// A write is all or nothing; only a refused one asks the kernel what it lacks (asking
			// costs an aborted transaction, several ms).
			if kerr := r.Kernel(ctx, t.Mode, rs); kerr != nil {
				return fmt.Errorf("%w (%v)", kerr, err)
			}
			return err
		}
		// After Apply: in the modes that decide by writing, it is the backend that wrote.
		out.Backend, out.Changed = a.Name(), res.Changed
		if res.Note != "" {
			t.log().Warn("backend fallback", "backend", a.Name(), "why", res.Note, "netns", netnsutil.Label(t.NetNS))
		}
		if err := r.removeOthers(ctx, t, a); err != nil {
			return err
		}
		// After the rules: policy routing an earlier TPROXY configuration needed.
		if err := r.Routing.Prune(rs.PolicyRoutes()); err != nil {
			return fmt.Errorf("remove the policy routing the rules no longer need: %w", err)
		}
		if rs.CloseWaitSecs > 0 {
			return r.setCloseWait(t, rs.CloseWaitSecs)
		}
		return nil
	})
	return out, err
}

// Show reads the rules in place and compares them with rs: the chosen backend's, any of ours
// that other backends hold (which should be none), and the close-wait timeout when rs sets one.
func (r Runner) Show(ctx context.Context, t Target, rs *iptables.Ruleset) (iptables.State, error) {
	r = r.withDefaults()
	var st iptables.State
	err := r.in(t, false, rs, func(a iptables.Applier, rs *iptables.Ruleset) error {
		var err error
		if st, err = a.Show(ctx, rs); err != nil {
			return fmt.Errorf("read rules with %s: %w", a.Name(), err)
		}
		have, err := r.Routing.Read()
		if err != nil {
			return fmt.Errorf("read the policy routing: %w", err)
		}
		st.Routes = iptables.CompareRoutes(rs.PolicyRoutes(), have)
		for _, o := range r.Others(a.Covers()) {
			es, err := o.Present(ctx)
			if notInKernel(t, o, err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("look for rules of ours in %s: %w", o.Name(), err)
			}
			st.Elsewhere = append(st.Elsewhere, es...)
		}
		if rs.CloseWaitSecs > 0 {
			st.Sysctls = append(st.Sysctls, r.readCloseWait(t, rs.CloseWaitSecs))
		}
		return nil
	})
	return st, err
}

// Read reads, under the shared lock and for iptables.Inspect, what of ours every backend holds
// (iptables-legacy only where /proc lists a table) and the policy routing.
func (r Runner) Read(ctx context.Context, t Target) (iptables.InPlace, error) {
	r = r.withDefaults()
	var in iptables.InPlace
	err := r.Enter(t, false, func() error {
		hs, err := nfnl.Read(ctx)
		if err != nil && !passedOver(err) {
			return err
		}
		in.Holdings = hs
		if len(xtables.LegacyTables(iptables.IPv4)) > 0 || len(xtables.LegacyTables(iptables.IPv6)) > 0 {
			a, err := xtables.New(iptables.ModeLegacy, xtables.Options{Wait: t.Wait})
			if err != nil {
				return fmt.Errorf("this namespace has iptables-legacy tables, which cannot be read: %w", err)
			}
			h, err := a.Holding(ctx)
			if err != nil {
				return err
			}
			in.Holdings = append(in.Holdings, h)
		}
		if in.Routes, err = r.Routing.Read(); err != nil {
			return fmt.Errorf("read the policy routing: %w", err)
		}
		return nil
	})
	return in, err
}

// Cleanup removes every rule and chain of ours from every backend, and nothing else.
func (r Runner) Cleanup(ctx context.Context, t Target) (Outcome, error) {
	r = r.withDefaults()
	var out Outcome
	err := r.in(t, true, nil, func(a iptables.Applier, _ *iptables.Ruleset) error {
		if err := a.Cleanup(ctx); err != nil && !notInKernel(t, a, err) {
			return fmt.Errorf("remove rules with %s: %w", a.Name(), err)
		}
		out.Backend = a.Name()
		if err := r.removeOthers(ctx, t, a); err != nil {
			return err
		}
		if err := r.Routing.Prune(nil); err != nil {
			return fmt.Errorf("remove the policy routing of ours: %w", err)
		}
		return nil
	})
	return out, err
}

// in enters the target, takes its lock, chooses the backend (the native table in a network
// namespace another user namespace owns) and decides rs's IPv6 under ipv6=auto, logging both.
func (r Runner) in(t Target, exclusive bool, rs *iptables.Ruleset, fn func(iptables.Applier, *iptables.Ruleset) error) error {
	return r.Enter(t, exclusive, func() error {
		opts, log := t.Options, t.log()
		userns, _ := netnsutil.ForeignUserNS("")
		if userns != "" {
			opts.Mode, log = iptables.ModeNFTables, log.With("userns", userns)
		}
		a, reason, err := r.Choose(opts)
		if err != nil {
			return fmt.Errorf("choose a backend for iptables mode %q: %w", t.Mode, err)
		}
		if userns != "" {
			reason = fmt.Sprintf(userNSReason, userns)
		}
		log.Log(context.Background(), t.ChoiceLevel, "backend chosen", "backend", a.Name(), "reason", reason, "mode", string(t.Mode), "netns", netnsutil.Label(t.NetNS))
		return fn(a, r.decideIPv6(t, rs))
	})
}

// decideIPv6 returns rs with its IPv6 decided by the caller's namespace under ipv6=auto, logged.
func (r Runner) decideIPv6(t Target, rs *iptables.Ruleset) *iptables.Ruleset {
	if rs == nil || !rs.IPv6Auto {
		return rs
	}
	on, why := r.IPv6()
	msg := "ipv6=auto: writing IPv6 rules"
	if !on {
		msg = "ipv6=auto: writing no IPv6 rules"
	}
	t.log().Log(context.Background(), t.ChoiceLevel, msg, "reason", why, "netns", netnsutil.Label(t.NetNS))
	return rs.ForIPv6(on)
}

// withDefaults fills the seams left nil with the real ones.
func (r Runner) withDefaults() Runner {
	if r.Choose == nil {
		r.Choose = New
	}
	if r.Others == nil {
		r.Others = realOthers
	}
	if r.Enter == nil {
		r.Enter = enterLocked
	}
	if r.Kernel == nil {
		r.Kernel = CheckKernelWith(Probes{})
	}
	if r.Routing == nil {
		r.Routing = routing.Netlink{}
	}
	if r.IPv6 == nil {
		r.IPv6 = NamespaceIPv6
	}
	return r
}

// setCloseWait sets the conntrack close-wait timeout over netlink (CAP_NET_ADMIN is enough; the
// sysctl file needs a writable /proc/sys, which a container rarely has), else the file.
func (r Runner) setCloseWait(t Target, secs int64) error {
	file := cmp.Or(r.CloseWaitFile, iptables.CloseWaitSysctl)
	if r.CloseWaitFile == "" {
		err := conntrack.SetCloseWait(uint32(secs))
		switch {
		case err == nil:
			t.log().Debug("conntrack close-wait timeout set", "seconds", secs)
			return nil
		case !errors.Is(err, conntrack.ErrUnsupported):
			return err
		}
		t.log().Warn("conntrack timeouts over netlink refused; writing the sysctl file instead", "file", file, "error", err.Error())
	}
	v := strconv.FormatInt(secs, 10)
	if err := os.WriteFile(file, []byte(v), 0o644); err != nil {
		return fmt.Errorf("set the conntrack close-wait timeout to %s s: %w", v, err)
	}
	t.log().Debug("conntrack close-wait timeout set", "file", file, "seconds", secs)
	return nil
}

// readCloseWait reads the close-wait timeout back as setCloseWait writes it, named by its sysctl.
func (r Runner) readCloseWait(t Target, want int64) iptables.SysctlState {
	s := iptables.SysctlState{File: cmp.Or(r.CloseWaitFile, iptables.CloseWaitSysctl),
		Want: strconv.FormatInt(want, 10)}
	if r.CloseWaitFile == "" {
		v, err := conntrack.CloseWait()
		switch {
		case err == nil:
			s.Have = strconv.FormatUint(uint64(v), 10)
			return s
		case !errors.Is(err, conntrack.ErrUnsupported):
			s.Have = "unreadable: " + err.Error()
			return s
		}
		t.log().Warn("conntrack timeouts over netlink refused; reading the sysctl file instead", "file", s.File, "error", err.Error())
	}
	if have, err := os.ReadFile(s.File); err != nil {
		s.Have = "unreadable: " + err.Error()
	} else {
		s.Have = strings.TrimSpace(string(have))
	}
	return s
}

// removeOthers removes our rules from the backends chosen does not cover (checked without exec).
func (r Runner) removeOthers(ctx context.Context, t Target, chosen iptables.Applier) error {
	var errs []error
	for _, o := range r.Others(chosen.Covers()) {
		if err := o.Cleanup(ctx); err != nil && !notInKernel(t, o, err) {
			errs = append(errs, fmt.Errorf("remove rules of ours left in %s by an earlier run: %w", o.Name(), err))
		}
	}
	return errors.Join(errs...)
}

// notInKernel reports, and logs at debug level, whether err says the kernel has no interface for
// backend a, which then holds nothing of ours (qemu-user, a kernel without nf_tables).
func notInKernel(t Target, a iptables.Applier, err error) bool {
	if !errors.Is(err, iptables.ErrNotInKernel) {
		return false
	}
	t.log().Debug("backend skipped: the kernel offers no interface for it, so it holds nothing of ours",
		"backend", a.Name(), "why", err.Error(), "netns", netnsutil.Label(t.NetNS))
	return true
}

// realOthers looks at the backends not covered: those of iptables-nft's rules and the native table
// through one nf_tables applier (one read and one batch), and iptables-legacy's only where /proc
// lists a legacy table (no exec in a fresh namespace; without the binaries none was written).
func realOthers(covered []iptables.Backend) []iptables.Applier {
	var out []iptables.Applier
	netlink := []iptables.Backend{iptables.BackendNFT, iptables.BackendNFTables}
	netlink = slices.DeleteFunc(netlink, func(b iptables.Backend) bool { return slices.Contains(covered, b) })
	if len(netlink) > 0 {
		out = append(out, nfnl.New(netlink...))
	}
	if !slices.Contains(covered, iptables.BackendLegacy) && (len(xtables.LegacyTables(iptables.IPv4)) > 0 || len(xtables.LegacyTables(iptables.IPv6)) > 0) {
		if a, err := xtables.New(iptables.ModeLegacy, xtables.Options{}); err == nil {
			out = append(out, a)
		}
	}
	return out
}
