package bench

import (
	"context"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// nftablesRows compares the native backend with `nft -f` of the same table, with the two
// iptables-restore execs, and with itself on a large config; and the netlink modes with each
// other: auto with the mode it picks, nft with native nftables.
func nftablesRows(b *testing.B, bin string) []row {
	rs := iptablestest.Build(b, chartConfig())
	// The nft script replaces the table, so it works on a namespace that has one. A fresh
	// namespace has none, and nft spends longer on the replacing form (docs/performance.md), so the
	// baseline is the bare table: the cheapest script that builds the same table.
	full := iptablestest.NFTScript(rs.NFT())
	script, ok := strings.CutPrefix(full, "table inet proxy_init\ndelete table inet proxy_init\n")
	if !ok {
		b.Fatalf("the nft script no longer starts with the table replacement the benchmark strips:\n%s", full)
	}
	nftFile := []step{{name: "nft", args: []string{"-f", "-"}, stdin: script}}
	// The least a Go program that writes this table pays: google/nftables and nothing else.
	minimal := []step{{name: goBuild(b, "", "../../test/minimalnft", "minimalnft")}}
	restores := restoreSteps(b, "nft", chartConfig())
	var rows []row
	got, base := compare(b, proxyInit(bin, "nftables"), nftFile)
	rows = append(rows, row{"proxy-init --iptables-mode nftables, chart defaults, v4+v6", got, base,
		"1x nft -f of the same table", "<= 1.0x", 1.0})
	got, base = compare(b, minimal, nftFile)
	rows = append(rows, row{"  floor: minimal google/nftables program, same table", got, base,
		"1x nft -f of the same table", "the least any Go tool can reach here", 0})
	got, base = compare(b, proxyInit(bin, "nftables"), restores)
	rows = append(rows, row{"proxy-init --iptables-mode nftables, chart defaults, v4+v6", got, base,
		"2x nft iptables-restore, same rules", "<= 0.8x", 0.8})
	got, base = compare(b, minimal, restores)
	rows = append(rows, row{"  floor: minimal google/nftables program, same table", got, base,
		"2x nft iptables-restore, same rules", "the least any Go tool can reach here", 0})
	// The netlink modes against that floor directly, and where the difference goes: starting a
	// larger binary, and reading the ruleset and planning (what --simulate does, sending nothing).
	for _, mode := range []string{"nftables", "nft"} {
		got, base = compare(b, proxyInit(bin, mode), minimal)
		rows = append(rows, row{"proxy-init --iptables-mode " + mode + ", chart defaults, v4+v6", got, base,
			"minimal google/nftables program", "<= 1.05x", 1.05})
	}
	empty := []step{{name: buildEmptyGo(b)}}
	version := []step{{name: bin, args: []string{"version"}}}
	got, base = compare(b, version, empty)
	rows = append(rows, row{"  where it goes: proxy-init version (start-up, no rules)", got, base,
		"an empty Go program", "start-up of the larger binary", 0})
	got, base = compare(b, minimal, empty)
	rows = append(rows, row{"  where it goes: minimal google/nftables program", got, base,
		"an empty Go program", "what the floor adds to starting at all", 0})
	got, base = compare(b, proxyInit(bin, "nftables", "--simulate"), version)
	rows = append(rows, row{"  where it goes: proxy-init nftables --simulate (reads, plans)", got, base,
		"proxy-init version", "flags, lock, the read, the plan; nothing sent", 0})

	// auto decides by writing with the backend it prefers, here iptables-nft's rules over
	// netlink: it should cost what naming that mode costs.
	got, base = compare(b, proxyInit(bin, "auto"), proxyInit(bin, "nft"))
	rows = append(rows, row{"proxy-init --iptables-mode auto (picks nft), chart defaults", got, base,
		"proxy-init --iptables-mode nft", "<= 1.05x", 1.05})
	got, base = compare(b, proxyInit(bin, "nft"), proxyInit(bin, "nftables"))
	rows = append(rows, row{"proxy-init --iptables-mode nft, chart defaults, v4+v6", got, base,
		"proxy-init --iptables-mode nftables", "<= 1.1x", 1.1})

	big := proxyInit(bin, "nftables", "--outbound-subnets-to-ignore", strings.Join(manySubnets(1000), ","),
		"--outbound-ports-to-ignore", strings.Join(portRanges(200), ","))
	got, base = compare(b, big, proxyInit(bin, "nftables"))
	rows = append(rows, row{"proxy-init nftables, 1,000 outbound subnets + 200 port ranges", got, base,
		"proxy-init nftables, chart defaults", "<= 1.5x", 1.5})
	return rows
}

func connectionModes() []string { return []string{"nft", "legacy", "nftables"} }

func applyIn(b *testing.B, n *nt.NS, c iptables.Config) {
	rs, err := iptables.Build(c)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := (runner.Runner{}).Apply(context.Background(), runner.Target{NetNS: n.Path(), Options: runner.Options{Mode: c.Mode}}, rs); err != nil {
		b.Fatal(err)
	}
}
