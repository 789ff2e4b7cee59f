package iptables_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

// The two renderings of the plan say the same thing, in both directions: for every config case
// and family, the iptables rules and the nftables rules reduce to the same list of decisions
// (chain, rule kind, verdict, matches, and the full port and address lists, merged across the
// rules iptables splits a list into), in the same order. A rule one rendering has and the
// other lacks, a list item missing from a set or a multiport group, or a different order fails.
func TestRenderingsAgree(t *testing.T) {
	for name, c := range iptablestest.GoldenConfigs() {
		t.Run(name, func(t *testing.T) {
			rs := iptablestest.Build(t, c)
			for _, f := range rs.Families {
				xt, nft := xtDecisions(rs, f), nftDecisions(rs.NFT(), f)
				if strings.Join(xt, "\n") != strings.Join(nft, "\n") {
					t.Errorf("%s: iptables and nftables renderings differ:\niptables:\n%s\nnftables:\n%s",
						f, strings.Join(xt, "\n"), strings.Join(nft, "\n"))
				}
				if len(xt) == 0 {
					t.Errorf("%s: no decisions rendered", f)
				}
			}
		})
	}
}

// decision is one rule's meaning, with list rules merged: what TestRenderingsAgree compares.
type decision struct {
	chain, kind, verdict, match string
	ports, sports               []iptables.NFTInterval
	addrs                       []iptables.NFTInterval
	addrType                    iptables.NFTSetType
}

func (d decision) String() string {
	var ps, ss, as []string
	for _, iv := range iptables.NormalizeIntervals(d.ports) {
		ps = append(ps, iptables.NFTPorts.ElementString(iv))
	}
	for _, iv := range iptables.NormalizeIntervals(d.sports) {
		ss = append(ss, iptables.NFTPorts.ElementString(iv))
	}
	for _, iv := range iptables.NormalizeIntervals(d.addrs) {
		as = append(as, d.addrType.ElementString(iv))
	}
	return fmt.Sprintf("%s %s %s [%s] ports=%v sports=%v addrs=%v", d.chain, d.kind, d.verdict, d.match, ps, ss, as)
}

// merge appends d to out, folding it into the previous decision when both are parts of one
// list (same chain, kind, verdict and other matches).
func merge(out []decision, d decision) []decision {
	if n := len(out); n > 0 {
		p := &out[n-1]
		if p.chain == d.chain && p.kind == d.kind && p.verdict == d.verdict && p.match == d.match && p.addrType == d.addrType {
			p.ports = append(p.ports, d.ports...)
			p.sports = append(p.sports, d.sports...)
			p.addrs = append(p.addrs, d.addrs...)
			return out
		}
	}
	return append(out, d)
}

func strs(ds []decision) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.String()
	}
	return out
}

func xtDecisions(rs *iptables.Ruleset, f iptables.Family) []string {
	typ := iptables.NFTIPv4
	if f == iptables.IPv6 {
		typ = iptables.NFTIPv6
	}
	var out []decision
	for _, r := range rs.XTRules(f) {
		d := decision{chain: r.Chain, kind: commentKind(r.Comment), verdict: r.Target}
		switch r.Target {
		case iptables.TargetRedirect:
			d.verdict += fmt.Sprintf(" %d", r.ToPort)
		case iptables.TargetTPROXY:
			d.verdict += fmt.Sprintf(" %d mark %#x", r.ToPort, r.Mark)
		case iptables.TargetCT:
			d.verdict += fmt.Sprintf(" zone %d", r.Zone)
		}
		var m []string
		if r.TCP {
			m = append(m, "tcp")
		}
		if r.UDP {
			m = append(m, "udp")
		}
		if r.UIDOwner != nil {
			m = append(m, fmt.Sprintf("uid %d", *r.UIDOwner))
		}
		if r.GIDOwner != nil {
			m = append(m, fmt.Sprintf("gid %d", *r.GIDOwner))
		}
		if r.InInterface != "" {
			m = append(m, "iif "+r.InInterface)
		}
		if r.OutInterface != "" {
			m = append(m, "oif "+r.OutInterface)
		}
		switch r.CTState {
		case iptables.CTStateInvalid:
			m = append(m, "ct invalid")
		case iptables.CTStateEstablished:
			m = append(m, "ct established,related")
		}
		d.match = strings.Join(m, " ")
		d.ports = portIntervals(append(slices.Clone(r.MultiportDPorts), nonZero(r.DPort)...))
		d.sports = portIntervals(nonZero(r.SPort))
		for _, p := range []netip.Prefix{r.Source, r.Destination} {
			if p.IsValid() {
				d.addrs, d.addrType = prefixIntervals([]netip.Prefix{p}), typ
				if p == r.Source {
					d.match += " saddr"
				} else {
					d.match += " daddr"
				}
			}
		}
		out = merge(out, d)
	}
	return strs(out)
}

func nonZero(p iptables.PortRange) []iptables.PortRange {
	if p.First == 0 {
		return nil
	}
	return []iptables.PortRange{p}
}

func nftDecisions(t iptables.NFTTable, f iptables.Family) []string {
	sets := map[string]iptables.NFTSet{}
	for _, s := range t.Sets {
		sets[s.Name] = s
	}
	port := func(p uint32) []iptables.NFTInterval {
		return portIntervals([]iptables.PortRange{{First: uint16(p), Last: uint16(p)}})
	}
	var out []decision
	var tproxy *iptables.NFTRule
	for _, c := range t.Chains {
	rules:
		for _, r := range c.Rules {
			// The drop after a TPROXY rule is what iptables' TPROXY target does itself.
			if r.Comment == iptables.CommentPrefix+iptables.NFTTPROXYDropName && tproxy != nil &&
				r.Verdict == iptables.NFTDrop && slices.Equal(r.Matches, tproxy.Matches) {
				continue
			}
			tproxy = nil
			d := decision{chain: c.Name, kind: commentKind(strings.SplitN(r.Comment, ",...+", 2)[0])}
			switch r.Verdict {
			case iptables.NFTReturn:
				d.verdict = "RETURN"
			case iptables.NFTRedirect:
				d.verdict = fmt.Sprintf("REDIRECT %d", r.RedirectPort)
			case iptables.NFTDrop:
				d.verdict = "DROP"
			case iptables.NFTZone:
				d.verdict = fmt.Sprintf("CT zone %d", r.Zone)
			case iptables.NFTTPROXY:
				d.verdict = fmt.Sprintf("TPROXY %d mark %#x", r.RedirectPort, r.Mark)
				if r.TPROXYFamily != "" && r.TPROXYFamily != f {
					continue rules
				}
				tproxy = &r
			}
			var m []string
			for _, x := range r.Matches {
				switch x.Kind {
				case iptables.NFTMatchNFProto:
					if x.Family != f {
						continue rules
					}
				case iptables.NFTMatchTCP, iptables.NFTMatchDPortSet:
					m = append(m, "tcp")
				case iptables.NFTMatchTCPDPort:
					m = append(m, "tcp")
					d.ports = port(x.ID)
				case iptables.NFTMatchUDPDPort:
					m = append(m, "udp")
					d.ports = port(x.ID)
				case iptables.NFTMatchUDPSPort:
					m = append(m, "udp")
					d.sports = port(x.ID)
				}
				if x.Kind == iptables.NFTMatchDPortSet {
					d.ports = sets[x.Set].Elements
				}
			}
			// iptables' canonical order: protocol, owner, interfaces, conntrack.
			for _, x := range r.Matches {
				switch x.Kind {
				case iptables.NFTMatchSkUID:
					m = append(m, fmt.Sprintf("uid %d", x.ID))
				case iptables.NFTMatchSkGID:
					m = append(m, fmt.Sprintf("gid %d", x.ID))
				}
			}
			for _, x := range r.Matches {
				switch x.Kind {
				case iptables.NFTMatchIIFName:
					m = append(m, "iif "+x.Name)
				case iptables.NFTMatchOIFName:
					m = append(m, "oif "+x.Name)
				case iptables.NFTMatchCTState:
					m = append(m, "ct "+strings.TrimPrefix(x.String(), "ct state "))
				}
			}
			for _, x := range r.Matches {
				switch x.Kind {
				case iptables.NFTMatchSAddrSet, iptables.NFTMatchDAddrSet:
					if x.Family != f {
						continue rules
					}
					d.addrs, d.addrType = sets[x.Set].Elements, sets[x.Set].Type
				}
			}
			d.match = strings.Join(m, " ")
			for _, x := range r.Matches {
				if x.Kind == iptables.NFTMatchSAddrSet {
					d.match += " saddr"
				} else if x.Kind == iptables.NFTMatchDAddrSet {
					d.match += " daddr"
				}
			}
			out = merge(out, d)
		}
	}
	return strs(out)
}

// commentKind is a rule's name without the list items it carries.
func commentKind(c string) string {
	c = strings.TrimPrefix(c, iptables.CommentPrefix)
	for _, k := range []string{"ignore-port-", "ignore-subnet-", "redirect-port-", "redirect-outbound-port-", "redirect-outbound-subnet-",
		"redirect-dns-udp-", "redirect-dns-tcp-", "dns-zone-captured-", "tproxy-port-"} {
		if strings.HasPrefix(c, k) {
			return k
		}
	}
	return c
}

func TestNFTSemantics(t *testing.T) {
	tests := []struct {
		name   string
		mod    func(*iptables.Config)
		chain  string
		want   []string // rule strings, without comments
		absent []string // substrings that must not appear in the script
	}{
		{
			name:  "chart defaults outbound",
			chain: iptables.OutputChain,
			want: []string{
				"meta skuid 2102 return",
				`oifname "lo" return`,
				"tcp dport @outbound_ignore_ports return",
				"meta l4proto tcp redirect to :4140",
			},
			absent: []string{"nfproto", "skgid"},
		},
		{
			name: "ipv6 off: redirects are ipv4 only, v6 subnets dropped",
			mod: func(c *iptables.Config) {
				c.IPv6 = false
				c.InboundSubnetsToIgnore = []string{"2001:db8::/32,192.0.2.0/24"}
			},
			chain: iptables.RedirectChain,
			want: []string{
				"tcp dport @inbound_ignore_ports return",
				"ip saddr @inbound_ignore_subnets_v4 return",
				"meta nfproto ipv4 meta l4proto tcp redirect to :4143",
			},
			absent: []string{"ipv6_addr", "2001:db8"},
		},
		{
			name:  "redirect listed",
			mod:   func(c *iptables.Config) { c.PortsToRedirect = []string{"80,443"}; c.InboundPortsToIgnore = nil },
			chain: iptables.RedirectChain,
			want:  []string{"tcp dport @inbound_redirect_ports redirect to :4143"},
		},
		{
			name: "gid and outbound subnets, both families",
			mod: func(c *iptables.Config) {
				c.ProxyGID = 7
				c.OutboundSubnetsToIgnore = []string{"2001:db8::1", "192.0.2.1"}
			},
			chain: iptables.OutputChain,
			want: []string{
				"meta skuid 2102 return",
				"meta skgid 7 return",
				`oifname "lo" return`,
				"tcp dport @outbound_ignore_ports return",
				"ip daddr @outbound_ignore_subnets_v4 return",
				"ip6 daddr @outbound_ignore_subnets_v6 return",
				"meta l4proto tcp redirect to :4140",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := iptablestest.ChartConfig()
			if tt.mod != nil {
				tt.mod(&c)
			}
			rs := iptablestest.Build(t, c)
			tbl := rs.NFT()
			var got []string
			for _, ch := range tbl.Chains {
				if ch.Name == tt.chain {
					for _, r := range ch.Rules {
						r.Comment = ""
						got = append(got, r.String())
					}
				}
			}
			if strings.Join(got, "\n") != strings.Join(tt.want, "\n") {
				t.Errorf("rules:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			script := strings.Join(tbl.Statements(), "\n")
			for _, a := range tt.absent {
				if strings.Contains(script, a) {
					t.Errorf("table contains %q:\n%s", a, script)
				}
			}
			// Every set a rule names exists, and every set is used.
			used := map[string]bool{}
			for _, ch := range tbl.Chains {
				for _, r := range ch.Rules {
					for _, m := range r.Matches {
						if m.Set != "" {
							used[m.Set] = true
						}
					}
				}
			}
			for _, s := range tbl.Sets {
				if !used[s.Name] {
					t.Errorf("set %s unused", s.Name)
				}
				delete(used, s.Name)
			}
			if len(used) > 0 {
				t.Errorf("rules name missing sets %v", used)
			}
		})
	}
}

func TestNFTSetElements(t *testing.T) {
	tests := []struct {
		name  string
		mod   func(*iptables.Config)
		set   string
		elems string
	}{
		{"adjacent ports merge", func(c *iptables.Config) {}, "inbound_ignore_ports", "4190-4191, 4567-4568"},
		{"overlapping ranges merge and sort", func(c *iptables.Config) { c.InboundPortsToIgnore = []string{"9000,1000-2000,1500-2500,2501,65535"} },
			"inbound_ignore_ports", "1000-2501, 9000, 65535"},
		{"contained and adjacent subnets", func(c *iptables.Config) {
			c.OutboundSubnetsToIgnore = []string{"192.0.2.0/25,192.0.2.128/25,192.0.2.7,203.0.113.0/30,203.0.113.4"}
		}, "outbound_ignore_subnets_v4", "192.0.2.0/24, 203.0.113.0-203.0.113.4"},
		{"v6 host and prefix", func(c *iptables.Config) { c.OutboundSubnetsToIgnore = []string{"2001:db8::1,2001:db8:1::/48"} },
			"outbound_ignore_subnets_v6", "2001:db8::1, 2001:db8:1::/48"},
		{"everything", func(c *iptables.Config) { c.InboundSubnetsToIgnore = []string{"0.0.0.0/0,10.0.0.0/8"} },
			"inbound_ignore_subnets_v4", "0.0.0.0/0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := iptablestest.ChartConfig()
			tt.mod(&c)
			tbl := iptablestest.Build(t, c).NFT()
			for _, s := range tbl.Sets {
				if s.Name == tt.set {
					if got := strings.Join(s.ElementStrings(), ", "); got != tt.elems {
						t.Errorf("elements = %s, want %s", got, tt.elems)
					}
					return
				}
			}
			t.Errorf("no set %s in %+v", tt.set, tbl.Sets)
		})
	}
}

func TestIntervalAfter(t *testing.T) {
	tests := []struct {
		last, want []byte
		ok         bool
	}{
		{[]byte{0, 0}, []byte{0, 1}, true},
		{[]byte{0, 0xff}, []byte{1, 0}, true},
		{[]byte{0xff, 0xff}, nil, false},
	}
	for _, tt := range tests {
		got, ok := iptables.NFTInterval{First: []byte{0, 0}, Last: tt.last}.After()
		if string(got) != string(tt.want) || ok != tt.ok {
			t.Errorf("After(%x) = %x,%v; want %x,%v", tt.last, got, ok, tt.want, tt.ok)
		}
	}
}

func TestCompareNFT(t *testing.T) {
	rs := iptablestest.Build(t, iptablestest.ChartConfig())
	want := rs.NFT()
	if d := iptables.CompareNFT(want, &want); !d.Empty() {
		t.Fatalf("identical tables differ: %s", d)
	}
	if d := iptables.CompareNFT(want, nil); len(d.Missing) != len(want.Statements()) {
		t.Errorf("absent table: %d missing, want %d", len(d.Missing), len(want.Statements()))
	}
	// A dropped rule and a changed set element are both reported, in nft syntax.
	have := rs.NFT()
	have.Chains[1].Rules = have.Chains[1].Rules[1:]
	have.Sets[0].Elements = have.Sets[0].Elements[:1]
	d := iptables.CompareNFT(want, &have)
	s := d.String()
	for _, sub := range []string{
		"missing: add rule inet proxy_init PROXY_INIT_OUTPUT meta skuid 2102 return",
		"missing: add set inet proxy_init inbound_ignore_ports",
		"extra: add set inet proxy_init inbound_ignore_ports { type inet_service; flags constant,interval; elements = { 4190-4191 }; }",
	} {
		if !strings.Contains(s, sub) {
			t.Errorf("diff lacks %q:\n%s", sub, s)
		}
	}
	// Swapped rules are reported as a reorder.
	have = rs.NFT()
	r := have.Chains[1].Rules
	r[0], r[1] = r[1], r[0]
	if d := iptables.CompareNFT(want, &have); !d.Reordered {
		t.Errorf("swapped rules not reported as reordered: %s", d)
	}
}

func TestNFTCommentRecordsPlan(t *testing.T) {
	a := iptablestest.Build(t, iptablestest.ChartConfig())
	c := iptablestest.ChartConfig()
	c.OutboundPortsToIgnore = []string{"443"}
	b := iptablestest.Build(t, c)
	if a.NFTComment() == b.NFTComment() {
		t.Errorf("different plans share the comment %q", a.NFTComment())
	}
	if !strings.Contains(a.NFT().Statements()[0], fmt.Sprintf("comment %q", a.NFTComment())) {
		t.Errorf("the table does not record the plan: %s", a.NFT().Statements()[0])
	}
}

// portIntervals and prefixIntervals are the set intervals a list covers, worked out here apart
// from the builder's own.
func portIntervals(ports []iptables.PortRange) []iptables.NFTInterval {
	var out []iptables.NFTInterval
	for _, p := range ports {
		out = append(out, iptables.NFTInterval{First: []byte{byte(p.First >> 8), byte(p.First)}, Last: []byte{byte(p.Last >> 8), byte(p.Last)}})
	}
	return out
}

func prefixIntervals(ps []netip.Prefix) []iptables.NFTInterval {
	var out []iptables.NFTInterval
	for _, p := range ps {
		first := p.Masked().Addr().AsSlice()
		last := slices.Clone(first)
		for b := p.Bits(); b < 8*len(last); b++ {
			last[b/8] |= 0x80 >> (b % 8)
		}
		out = append(out, iptables.NFTInterval{First: first, Last: last})
	}
	return out
}
