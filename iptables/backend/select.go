// Package backend chooses the applier for a mode, including "auto", and keeps one backend's rules
// in a namespace at a time. It decides nothing about which rules exist; that is the builder's job.
// The Applier interface itself is declared in package iptables.
package backend

import (
	"context"
	"fmt"
	"time"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/nftables"
	"github.com/kubemesh/proxy-init/iptables/xtables"
)

// Options choose and configure a backend.
type Options struct {
	Mode iptables.Mode
	// Wait makes the iptables binaries wait for the xtables lock, at most WaitTimeout.
	Wait        bool
	WaitTimeout time.Duration
}

// New returns the applier for opts.Mode and a human-readable reason for the choice, which callers
// log: in auto mode it is the only record of why a node got the backend it got.
func New(opts Options) (iptables.Applier, string, error) {
	xo := xtables.Options{Wait: opts.Wait, WaitTimeout: opts.WaitTimeout}
	switch opts.Mode {
	case iptables.ModeLegacy, iptables.ModeNFT, iptables.ModePlain:
		a, err := xtables.New(opts.Mode, xo)
		if err != nil {
			return nil, "", err
		}
		return a, fmt.Sprintf("--iptables-mode=%s asks for it", opts.Mode), nil
	case iptables.ModeNFTables:
		return nftables.New(), "--iptables-mode=nftables asks for it", nil
	case iptables.ModeAuto, "":
		return auto(xo)
	}
	return nil, "", fmt.Errorf("iptables mode %q has no backend", opts.Mode)
}

// auto prefers native nftables (no binaries, one batch for both families), then iptables-nft,
// then iptables-legacy. The probes are netlink round trips, not execs.
func auto(xo xtables.Options) (iptables.Applier, string, error) {
	probe := nftables.Probe(context.Background())
	if probe == nil {
		return nftables.New(), "auto: the kernel accepts nf_tables nat and redirect over netlink", nil
	}
	if err := xtables.ProbeNFTables(); err == nil {
		a, err := xtables.New(iptables.ModeNFT, xo)
		if err == nil {
			return a, fmt.Sprintf("auto: iptables-nft, because native nftables failed its probe: %v", probe), nil
		}
		probe = fmt.Errorf("%v; iptables-nft: %w", probe, err)
	}
	a, err := xtables.New(iptables.ModeLegacy, xo)
	if err != nil {
		return nil, "", fmt.Errorf("auto: no usable backend: nf_tables: %v; legacy: %w", probe, err)
	}
	return a, fmt.Sprintf("auto: falling back to iptables-legacy because %v", probe), nil
}
