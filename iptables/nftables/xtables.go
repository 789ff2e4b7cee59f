package nftables

// Removal of the rules that the iptables-nft binaries wrote for us. iptables-nft keeps its rules
// in nftables tables ("ip nat", "ip6 nat"), so they can be found and deleted over netlink, in
// the same batch that writes our table: one backend's rules redirect at a time, with no gap and
// no overlap. iptables-legacy rules live in x_tables and are invisible here.

import (
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

// xtFamilies are the iptables-nft families whose nat table may hold our chains.
var xtFamilies = []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6}

// xtRemoval adds to b the messages that delete our iptables-nft chains and every rule that jumps
// to them, in the nat tables listed in tables. It returns how many chains and jump rules it
// found. It reads only when a nat table exists, so a fresh namespace costs nothing.
func xtRemoval(b *batch, gc func() (*nftables.Conn, error), tables []tableInfo) (int, error) {
	found := 0
	for _, fam := range xtFamilies {
		if findTable(tables, byte(fam), iptables.Table) == nil {
			continue
		}
		c, err := gc()
		if err != nil {
			return 0, err
		}
		chains, err := c.ListChainsOfTableFamily(fam)
		if err != nil {
			return 0, fmt.Errorf("list iptables-nft chains: %w", err)
		}
		tbl := &nftables.Table{Name: iptables.Table, Family: fam}
		var ours []*nftables.Chain
		for _, ch := range chains {
			if ch.Table == nil || ch.Table.Name != iptables.Table {
				continue
			}
			if iptables.IsOurChain(ch.Name) {
				ours = append(ours, ch)
				continue
			}
			rules, err := c.GetRules(tbl, ch)
			if err != nil {
				return 0, fmt.Errorf("list iptables-nft rules of %s: %w", ch.Name, err)
			}
			for _, r := range rules {
				if !jumpsToOurs(r) {
					continue
				}
				found++
				b.add(unix.NFT_MSG_DELRULE, 0, byte(fam), []netlink.Attribute{
					{Type: unix.NFTA_RULE_TABLE, Data: cstr(iptables.Table)},
					{Type: unix.NFTA_RULE_CHAIN, Data: cstr(ch.Name)},
					{Type: unix.NFTA_RULE_HANDLE, Data: u64(r.Handle)},
				}, fmt.Sprintf("delete iptables-nft jump in %s %s %s (handle %d)", familyName(fam), iptables.Table, ch.Name, r.Handle))
			}
		}
		for _, ch := range ours {
			found++
			b.add(unix.NFT_MSG_DELRULE, 0, byte(fam), []netlink.Attribute{
				{Type: unix.NFTA_RULE_TABLE, Data: cstr(iptables.Table)},
				{Type: unix.NFTA_RULE_CHAIN, Data: cstr(ch.Name)},
			}, fmt.Sprintf("flush iptables-nft chain %s %s %s", familyName(fam), iptables.Table, ch.Name))
			b.add(unix.NFT_MSG_DELCHAIN, 0, byte(fam), []netlink.Attribute{
				{Type: unix.NFTA_CHAIN_TABLE, Data: cstr(iptables.Table)},
				{Type: unix.NFTA_CHAIN_NAME, Data: cstr(ch.Name)},
			}, fmt.Sprintf("delete iptables-nft chain %s %s %s", familyName(fam), iptables.Table, ch.Name))
		}
	}
	return found, nil
}

func jumpsToOurs(r *nftables.Rule) bool {
	for _, e := range r.Exprs {
		if v, ok := e.(*expr.Verdict); ok && (v.Kind == expr.VerdictJump || v.Kind == expr.VerdictGoto) &&
			iptables.IsOurChain(v.Chain) {
			return true
		}
	}
	return false
}

func familyName(f nftables.TableFamily) string {
	if f == nftables.TableFamilyIPv6 {
		return "ip6"
	}
	return "ip"
}
