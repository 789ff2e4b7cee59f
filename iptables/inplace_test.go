package iptables_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

// xtHolding is what an iptables backend holds once rs is applied.
func xtHolding(b iptables.Backend, perFamily bool, rs *iptables.Ruleset) iptables.Holding {
	return iptables.Holding{Backend: b, PerFamily: perFamily, Saved: map[iptables.Family]iptables.SavedState{
		iptables.IPv4: rs.Saved(iptables.IPv4), iptables.IPv6: rs.Saved(iptables.IPv6)}}
}

func nftHolding(rs *iptables.Ruleset) iptables.Holding {
	t := rs.NFT()
	return iptables.Holding{Backend: iptables.BackendNFTables, Table: &t}
}

// TestInspectRebuildsEveryConfig: the configuration read back from the rules of every golden
// config is the one that wrote them (the same plan hash), in every rendering, and whole.
func TestInspectRebuildsEveryConfig(t *testing.T) {
	for name, c := range iptablestest.GoldenConfigs() {
		rs := iptablestest.Build(t, c)
		for _, h := range []iptables.Holding{
			xtHolding(iptables.BackendNFT, false, rs),
			xtHolding(iptables.BackendLegacy, true, rs),
			nftHolding(rs),
		} {
			t.Run(name+"/"+string(h.Backend), func(t *testing.T) {
				f := iptables.Inspect(iptables.InPlace{Holdings: []iptables.Holding{h}, Routes: routeLines(rs)})
				if !f.Whole() {
					t.Fatalf("not whole: %q\nfamilies: %+v", f.Problems, f.Families)
				}
				if f.Backend != h.Backend || f.Rules.Hash() != rs.Hash() {
					t.Errorf("read back %s %v (hash %s), want %s %v (hash %s)", f.Backend, f.Rules.Args(), f.Rules.Hash(), h.Backend, rs.Args(), rs.Hash())
				}
			})
		}
	}
}

func routeLines(rs *iptables.Ruleset) []string {
	var out []string
	for _, p := range rs.PolicyRoutes() {
		out = append(out, p.Lines()...)
	}
	return out
}

// TestInspectFindsWhatIsWrong: each way the rules in place can be incomplete is named, and no
// cause is claimed that the backend makes impossible.
func TestInspectFindsWhatIsWrong(t *testing.T) {
	chart := iptablestest.Build(t, iptablestest.ChartConfig())
	off := iptablestest.ChartConfig()
	off.IPv6 = false
	ipv4Only := iptablestest.Build(t, off)
	drop := func(h iptables.Holding, f iptables.Family, match string) iptables.Holding {
		s := h.Saved[f]
		s.Rules = slices.DeleteFunc(slices.Clone(s.Rules), func(l string) bool { return strings.Contains(l, match) })
		h.Saved = map[iptables.Family]iptables.SavedState{iptables.IPv4: h.Saved[iptables.IPv4], iptables.IPv6: h.Saved[iptables.IPv6], f: s}
		return h
	}
	tamperedSet := nftHolding(chart)
	tamperedSet.Table.Sets[0].Elements = tamperedSet.Table.Sets[0].Elements[1:]
	tamperedPort := nftHolding(chart)
	out := &tamperedPort.Table.Chains[1].Rules[len(tamperedPort.Table.Chains[1].Rules)-1]
	out.RedirectPort = 4141
	otherPorts := iptablestest.ChartConfig()
	otherPorts.InboundPortsToIgnore = []string{"4190"}
	v6Other := xtHolding(iptables.BackendNFT, false, iptablestest.Build(t, otherPorts))

	for _, tc := range []struct {
		name     string
		in       []iptables.Holding
		whole    bool
		problems []string
		notes    []string
	}{
		{name: "nothing", problems: []string{"no backend holds rules of ours: nothing redirects this namespace's traffic"}},
		{name: "nft without ipv6", in: []iptables.Holding{xtHolding(iptables.BackendNFT, false, ipv4Only)}, whole: true,
			notes: []string{"ipv6 holds none of our rules: written with --ipv6=false (iptables-nft's rules are written in one transaction for both families, so no run was cut short)"}},
		{name: "legacy without ipv6", in: []iptables.Holding{xtHolding(iptables.BackendLegacy, true, ipv4Only)}, whole: true,
			notes: []string{"ipv6 holds none of our rules: written with --ipv6=false, or a run was stopped between the two families' transactions (iptables-legacy writes one per family); if the pod should have IPv6 rules, apply again"}},
		{name: "nftables without ipv6", in: []iptables.Holding{nftHolding(ipv4Only)}, whole: true,
			notes: []string{"the table acts on ipv4 only: written with --ipv6=false (the native table is written whole in one transaction, so no run was cut short)"}},
		{name: "legacy without ipv4", in: []iptables.Holding{drop(xtHolding(iptables.BackendLegacy, true, chart), iptables.IPv4, "")},
			problems: []string{"ipv4 holds none of our rules but ipv6 does: a run was stopped between the two families' transactions (iptables-legacy writes one per family; cleanup removes ipv4 first): apply again, or clean up"}},
		{name: "nft without ipv4", in: []iptables.Holding{drop(xtHolding(iptables.BackendNFT, false, chart), iptables.IPv4, "")},
			problems: []string{"ipv4 holds none of our rules but ipv6 does: they were removed by something else (iptables-nft's rules are written and removed in one transaction for both families)"}},
		{name: "jump missing", in: []iptables.Holding{drop(xtHolding(iptables.BackendNFT, false, chart), iptables.IPv6, "-A OUTPUT ")},
			problems: []string{"ipv6 lacks 1 of the jumps into our chains: packets never reach their rules"}},
		{name: "rule missing", in: []iptables.Holding{drop(xtHolding(iptables.BackendNFT, false, chart), iptables.IPv4, "ignore-loopback")},
			problems: []string{"ipv4 lacks 1 of the lines that configuration writes"}},
		{name: "families disagree", in: []iptables.Holding{{Backend: iptables.BackendNFT, Saved: map[iptables.Family]iptables.SavedState{
			iptables.IPv4: chart.Saved(iptables.IPv4), iptables.IPv6: v6Other.Saved[iptables.IPv6]}}},
			problems: []string{"ipv6 lacks 1 of the lines that configuration writes", "ipv6 holds 1 lines that configuration does not write"}},
		{name: "no redirect", in: []iptables.Holding{drop(xtHolding(iptables.BackendNFT, false, ipv4Only), iptables.IPv4, "redirect-all-incoming")},
			problems: []string{"the rules in place make no whole configuration: incoming-proxy-port \"-1\": must be set"},
			notes:    []string{"ipv6 holds none of our rules: written with --ipv6=false (iptables-nft's rules are written in one transaction for both families, so no run was cut short)"}},
		{name: "two backends", in: []iptables.Holding{xtHolding(iptables.BackendLegacy, true, chart), xtHolding(iptables.BackendNFT, false, chart)},
			problems: []string{"iptables-legacy also holds rules of ours, left by a run in another mode (apply or cleanup removes them)"}},
		{name: "set changed", in: []iptables.Holding{tamperedSet},
			problems: []string{"inet lacks 1 of the lines that configuration writes", "inet holds 1 lines that configuration does not write"}},
		{name: "rule changed", in: []iptables.Holding{tamperedPort},
			problems: []string{`the table records the plan "proxy-init/plan ` + chart.Hash() + ` format 1", but its rules are those of "proxy-init/plan ` +
				tamperedHash(t) + ` format 1": it was changed after it was written`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := iptables.Inspect(iptables.InPlace{Holdings: tc.in})
			if f.Whole() != tc.whole || !slices.Equal(f.Problems, tc.problems) || !slices.Equal(f.Notes, tc.notes) {
				t.Errorf("whole %t, problems %q, notes %q\nwant whole %t, problems %q, notes %q", f.Whole(), f.Problems, f.Notes, tc.whole, tc.problems, tc.notes)
			}
		})
	}
}

// tamperedHash is the plan of the chart's configuration redirecting outbound to 4141.
func tamperedHash(t *testing.T) string {
	c := iptablestest.ChartConfig()
	c.OutboundProxyPort = 4141
	return iptablestest.Build(t, c).Hash()
}

func TestArgs(t *testing.T) {
	c := iptablestest.ChartConfig()
	c.IPv6 = false
	got := strings.Join(iptablestest.Build(t, c).Args(), " ")
	want := "--incoming-proxy-port 4143 --outgoing-proxy-port 4140 --proxy-uid 2102 --inbound-ports-to-ignore 4190,4191,4567,4568 --outbound-ports-to-ignore 4567,4568 --ipv6=false"
	if got != want {
		t.Errorf("Args = %s\nwant   %s", got, want)
	}
}

// Chains of ours without a rule (what an interrupted tool might leave) make no configuration,
// and no family is said to hold rules.
func TestInspectEmptyChains(t *testing.T) {
	h := iptables.Holding{Backend: iptables.BackendLegacy, PerFamily: true, Saved: map[iptables.Family]iptables.SavedState{
		iptables.IPv4: {Chains: []string{iptables.OutputChain, iptables.RedirectChain}}}}
	f := iptables.Inspect(iptables.InPlace{Holdings: []iptables.Holding{h}})
	want := []string{
		`the rules in place make no whole configuration: incoming-proxy-port "-1": must be set`,
		`the rules in place make no whole configuration: outgoing-proxy-port "-1": must be set`,
	}
	if f.Whole() || f.Backend != iptables.BackendLegacy || !slices.Equal(f.Problems, want) || len(f.Notes) > 0 {
		t.Errorf("whole %t, backend %s, problems %q, notes %q; want problems %q", f.Whole(), f.Backend, f.Problems, f.Notes, want)
	}
}
