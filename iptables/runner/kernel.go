package runner

// What the Runner asks the kernel beside the rules: after a failed write, whether it can run
// iptables-legacy and TPROXY; for ipv6=auto, whether the namespace has IPv6.

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"strings"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/nfnl"
	"github.com/kubemesh/proxy-init/iptables/xtables"
)

// ErrKernelLacks marks an apply refused for a feature or backend the kernel lacks; none written.
var ErrKernelLacks = errors.New("the kernel lacks support")

// Probes are what CheckKernelWith asks the kernel; a nil one asks the real kernel.
type Probes struct {
	// TPROXY says which TPROXYs the kernel has (nfnl.ProbeTPROXY).
	TPROXY func(context.Context) (nfnl.TPROXYSupport, error)
	// Legacy says why family f has no iptables-legacy, nil if it has (xtables.LegacyMissing).
	Legacy func(f iptables.Family) error
}

// CheckKernelWith, the Runner's Kernel, says whether the kernel (as p finds it) cannot run rs in
// mode: iptables-legacy without the legacy ip_tables; TPROXY without iptables' TPROXY target, or
// nftables' tproxy expression (nftables mode), or either (auto). Where the kernel cannot be asked
// (no nf_tables netlink, no privilege), it says nothing and the write's own error stands.
func CheckKernelWith(p Probes) func(context.Context, iptables.Mode, *iptables.Ruleset) error {
	if p.TPROXY == nil {
		p.TPROXY = nfnl.ProbeTPROXY
	}
	if p.Legacy == nil {
		p.Legacy = xtables.LegacyMissing
	}
	return func(ctx context.Context, mode iptables.Mode, rs *iptables.Ruleset) error {
		if rs == nil {
			return nil
		}
		if writesLegacy(mode) {
			if err := legacyVerdict(mode, rs.Families, p.Legacy); err != nil {
				return err
			}
		}
		if !rs.TPROXY {
			return nil
		}
		if s, err := p.TPROXY(ctx); err == nil {
			return tproxyVerdict(mode, s)
		}
		return nil // the kernel cannot be asked: the write's own error stands
	}
}

// writesLegacy reports whether mode writes with iptables-legacy alone (auto's errors say it).
func writesLegacy(mode iptables.Mode) bool {
	if mode == iptables.ModePlain {
		f, err := xtables.DetectPlain()
		return err == nil && f == iptables.BackendLegacy
	}
	return mode == iptables.ModeLegacy
}

// legacyVerdict is CheckKernelWith's answer for iptables-legacy: the rules are not moved to
// nf_tables behind the operator's back; the error says which modes work without it.
func legacyVerdict(mode iptables.Mode, families []iptables.Family, missing func(iptables.Family) error) error {
	var why []string
	for _, f := range families {
		if err := missing(f); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", f, err))
		}
	}
	if len(why) == 0 {
		return nil
	}
	return fmt.Errorf("iptables mode %s: %w for iptables-legacy (%s): kernels from Linux 6.17 have the legacy ip_tables and ip6_tables only "+
		"when built with CONFIG_NETFILTER_XTABLES_LEGACY and CONFIG_IP_NF_IPTABLES_LEGACY / CONFIG_IP6_NF_IPTABLES_LEGACY, and elsewhere "+
		"their modules may not be loaded; iptables mode auto or nft writes the same rules over nf_tables; nothing was written",
		mode, ErrKernelLacks, strings.Join(why, "; "))
}

// tproxyVerdict is CheckKernelWith's answer for what the probe found.
func tproxyVerdict(mode iptables.Mode, s nfnl.TPROXYSupport) error {
	xt := fmt.Sprintf("iptables' TPROXY target (xt_TPROXY, CONFIG_NETFILTER_XT_TARGET_TPROXY): %v", s.XTErr)
	native := fmt.Sprintf("nftables' tproxy expression (nft_tproxy, CONFIG_NFT_TPROXY): %v", s.NativeErr)
	ok, missing := s.XT, []string{xt}
	switch mode {
	case iptables.ModeNFTables:
		ok, missing = s.Native, []string{native}
	case iptables.ModeAuto, "":
		ok, missing = s.XT || s.Native, []string{xt, native}
	}
	if ok {
		return nil
	}
	return fmt.Errorf("inbound-mode tproxy: %w for TPROXY in iptables mode %s, which needs %s; nothing was written",
		ErrKernelLacks, mode, strings.Join(missing, ", or "))
}

// NamespaceIPv6 says whether the thread's namespace has IPv6 and a global address, and why.
func NamespaceIPv6() (bool, string) {
	v, err := os.ReadFile("/proc/sys/net/ipv6/conf/all/disable_ipv6")
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return false, "the kernel has no IPv6 (booted with ipv6.disable=1, or built without it)"
	case err != nil:
		return false, "cannot tell whether IPv6 is enabled: " + err.Error()
	case strings.TrimSpace(string(v)) != "0":
		return false, "IPv6 is disabled in the network namespace (net.ipv6.conf.all.disable_ipv6=" + strings.TrimSpace(string(v)) + ")"
	}
	// One line an address: address, interface index, prefix length, scope, flags, interface.
	data, err := os.ReadFile("/proc/thread-self/net/if_inet6")
	if err != nil {
		return false, "cannot list the IPv6 addresses: " + err.Error()
	}
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l) // scope 0x10 is the host's (loopback), 0x20 the link's
		if len(f) < 6 || len(f[0]) != 32 || f[3] == "10" || f[3] == "20" {
			continue
		}
		var a [16]byte
		if _, err := hex.Decode(a[:], []byte(f[0])); err != nil {
			continue
		}
		return true, fmt.Sprintf("IPv6 is enabled and interface %s has address %s", f[5], netip.AddrFrom16(a))
	}
	return false, "IPv6 is enabled but no interface has an IPv6 address other than loopback and link-local"
}
