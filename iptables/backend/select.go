// Package backend chooses the applier for a mode, including "auto", and keeps one backend's rules
// in a namespace at a time. It decides nothing about which rules exist; that is the builder's job.
// The Applier interface itself is declared in package iptables.
package backend

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/nftables"
	"github.com/kubemesh/proxy-init/iptables/xtables"
	"github.com/kubemesh/proxy-init/iptables/xtnft"
)

// Options choose and configure a backend.
type Options struct {
	Mode iptables.Mode
	// Wait makes the iptables binaries wait for the xtables lock, at most WaitTimeout.
	Wait        bool
	WaitTimeout time.Duration
}

// New returns the applier for opts.Mode and a human-readable reason for the choice, which callers
// log: in auto mode it is the only record of why a node got the backend it got. The modes nft
// and auto decide by writing (see Fallback); their Result.Note says which backend wrote when the
// first could not.
func New(opts Options) (iptables.Applier, string, error) {
	xo := xtables.Options{Wait: opts.Wait, WaitTimeout: opts.WaitTimeout}
	binaries := func(m iptables.Mode) func() (iptables.Applier, error) {
		return func() (iptables.Applier, error) {
			a, err := xtables.New(m, xo)
			if err != nil {
				return nil, err
			}
			return a, nil
		}
	}
	netlink := try{"iptables-nft over netlink", func() (iptables.Applier, error) { return xtnft.New(), nil }}
	switch opts.Mode {
	case iptables.ModeLegacy, iptables.ModePlain:
		a, err := xtables.New(opts.Mode, xo)
		if err != nil {
			return nil, "", err
		}
		return a, fmt.Sprintf("--iptables-mode=%s asks for it", opts.Mode), nil
	case iptables.ModeNFT:
		return &Fallback{tries: []try{netlink, {"the iptables-nft binaries", binaries(iptables.ModeNFT)}}},
			"--iptables-mode=nft asks for iptables-nft's rules: written over netlink, or by the iptables-nft binaries where the kernel refuses that", nil
	case iptables.ModeNFTables:
		return nftables.New(), "--iptables-mode=nftables asks for it", nil
	case iptables.ModeAuto, "":
		return &Fallback{tries: []try{
				netlink,
				{"native nftables", func() (iptables.Applier, error) { return nftables.New(), nil }},
				{"iptables-legacy", binaries(iptables.ModeLegacy)},
			}},
			"auto: the first the kernel accepts of iptables-nft's rules over netlink (what `iptables -t nat -S` shows), the native nftables table, iptables-legacy", nil
	}
	return nil, "", fmt.Errorf("iptables mode %q has no backend", opts.Mode)
}

// Apply writes rs with a, then removes our rules from every other backend, so only one backend's
// rules redirect at a time. The old rules go only after the new ones are in place: there is never
// a moment without redirection.
func Apply(ctx context.Context, a iptables.Applier, rs *iptables.Ruleset) (iptables.Result, error) {
	res, err := a.Apply(ctx, rs)
	if err != nil {
		return res, err
	}
	return res, removeOthers(ctx, a)
}

// Cleanup removes our rules from every backend that holds some, starting with a.
func Cleanup(ctx context.Context, a iptables.Applier) error {
	err := a.Cleanup(ctx)
	if iptables.IsCapabilityError(err) {
		return err // every other backend would be refused the same way
	}
	return errors.Join(err, removeOthers(ctx, a))
}

// removeOthers cleans up the backends other than keep. Each cleanup first checks, without exec,
// whether there is anything to remove, so this costs no process spawns in the common case.
func removeOthers(ctx context.Context, keep iptables.Applier) error {
	var errs []error
	if f, ok := keep.(*Fallback); ok {
		keep = f.Chosen()
	}
	x, _ := keep.(*xtables.Applier)
	_, native := keep.(*nftables.Applier)
	_, xtNetlink := keep.(*xtnft.Applier)
	// The netlink writer removes the native table in its own transaction.
	if !native && !xtNetlink {
		if err := nftables.New().Cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("remove the nftables table left by an earlier run: %w", err))
		}
	}
	// The native applier removes iptables-nft's chains in its own batch; the others need it here.
	if !native && !xtNetlink && (x == nil || x.Flavor() != xtables.NFT) {
		// Over netlink, so it works on hosts without iptables-nft binaries.
		if _, err := nftables.RemoveXtablesNFT(ctx); err != nil {
			errs = append(errs, fmt.Errorf("remove iptables-nft rules left by an earlier run: %w", err))
		}
	}
	// Legacy rules are invisible to netlink, but /proc tells whether a legacy nat table exists;
	// in a fresh namespace it does not, and the binaries are not even looked up. Without the
	// binaries no earlier run could have written legacy rules from this image.
	if (x == nil || x.Flavor() != xtables.Legacy) &&
		(xtables.LegacyNATExists(iptables.IPv4) || xtables.LegacyNATExists(iptables.IPv6)) {
		if legacy, err := xtables.New(iptables.ModeLegacy, xtables.Options{}); err == nil {
			if err := legacy.Cleanup(ctx); err != nil {
				errs = append(errs, fmt.Errorf("remove iptables-legacy rules left by an earlier run: %w", err))
			}
		}
	}
	return errors.Join(errs...)
}
