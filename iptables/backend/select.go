// Package backend chooses the applier for a mode, including "auto", and runs the one path from a
// ruleset to a namespace (Runner: enter, lock, choose, write or read or remove, clear the other
// backends, close-wait), so one backend's rules redirect at a time. It decides nothing about which
// rules exist; that is the builder's job. The Applier interface itself is declared in package
// iptables.
package backend

import (
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
	case iptables.ModePlain:
		// Plain iptables that drives nf_tables writes iptables-nft's rules, which the netlink
		// writer writes too, in one transaction for both families and without exec.
		if f, err := xtables.DetectPlain(); err == nil && f == xtables.NFT {
			return &Fallback{tries: []try{netlink, {"the iptables binaries", binaries(iptables.ModePlain)}}},
				"--iptables-mode=plain, and the iptables binaries drive nf_tables: their rules written over netlink, or by the binaries where the kernel refuses that", nil
		}
		fallthrough
	case iptables.ModeLegacy:
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
