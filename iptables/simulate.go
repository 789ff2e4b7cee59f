package iptables

import (
	"fmt"
	"strings"
)

// CloseWaitSysctl is the conntrack CLOSE_WAIT timeout a plan with CloseWaitSecs sets, per
// network namespace.
const CloseWaitSysctl = "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"

// Simulation renders what an apply in mode writes into a namespace that holds none of our rules
// (an init container's first run): for the iptables modes the iptables-restore --noflush payload
// per family, for nftables the nft script. Auto decides at run time, by writing, so it shows
// both. It is what proxy-init --simulate prints and what the CNI plugin logs with
// "simulate": true.
func (r *Ruleset) Simulation(mode Mode) string {
	nft := func(b *strings.Builder) {
		b.WriteString("# nftables: nft -f - (one inet table for both families, one atomic batch)\n")
		b.WriteString(r.NFTScript())
	}
	xt := func(b *strings.Builder, f Family) { b.WriteString(r.Payload(f, SavedState{})) }
	return simulation(mode, r.Families, nft, xt, func(b *strings.Builder) {
		if r.CloseWaitSecs > 0 {
			fmt.Fprintf(b, "# and write %d to %s\n", r.CloseWaitSecs, CloseWaitSysctl)
		}
	})
}

// CleanupSimulation renders, in the same form as Simulation, what removes the rules an apply
// left. Cleanup removes rules of ours from every backend, not only the one mode names.
func CleanupSimulation(mode Mode) string {
	nft := func(b *strings.Builder) {
		b.WriteString("# nftables: nft -f -\n")
		b.WriteString(NFTCleanupScript())
	}
	xt := func(b *strings.Builder, _ Family) { b.WriteString(CleanupPayload()) }
	return simulation(mode, []Family{IPv4, IPv6}, nft, xt, func(b *strings.Builder) {
		b.WriteString("# cleanup also removes rules of ours that any other backend holds\n")
	})
}

// simulation writes the nftables part (nftables and auto modes), the iptables-restore part per
// family (every mode but nftables), then the tail.
func simulation(mode Mode, fams []Family, nft func(*strings.Builder), xt func(*strings.Builder, Family), tail func(*strings.Builder)) string {
	var b strings.Builder
	if mode == ModeAuto || mode == "" {
		b.WriteString("# auto chooses at run time, by writing: iptables-nft's rules over netlink (the rules of the\n")
		b.WriteString("# iptables-restore payloads below), else the native nftables table (the nft script), else\n")
		b.WriteString("# iptables-legacy (the same payloads)\n")
	}
	if mode == ModeNFTables || mode == ModeAuto || mode == "" {
		nft(&b)
	}
	if mode != ModeNFTables {
		for _, f := range fams {
			bin := "iptables-restore"
			if f == IPv6 {
				bin = "ip6tables-restore"
			}
			fmt.Fprintf(&b, "# %s: %s --noflush\n", f, bin)
			xt(&b, f)
		}
	}
	tail(&b)
	return b.String()
}
