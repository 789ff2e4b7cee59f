package iptables

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestGoldenNFTScripts(t *testing.T) {
	for name, c := range GoldenConfigs() {
		t.Run(name, func(t *testing.T) {
			rs, err := Build(c)
			if err != nil {
				t.Fatal(err)
			}
			checkGolden(t, filepath.Join("nft", name+".nft"), rs.NFTScript())
		})
	}
}

func mustBuild(t *testing.T, c Config) *Ruleset {
	t.Helper()
	rs, err := Build(c)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func chartConfig() Config {
	c := NewConfig()
	c.InboundProxyPort, c.OutboundProxyPort, c.ProxyUID = 4143, 4140, 2102
	c.InboundPortsToIgnore = []string{"4190,4191,4567,4568"}
	c.OutboundPortsToIgnore = []string{"4567,4568"}
	return c
}

// The two renderings of the plan say the same thing, in both directions: for every config case
// and family, the iptables rules and the nftables rules reduce to the same list of decisions
// (chain, rule kind, verdict, matches, and the full port and address lists, merged across the
// rules iptables splits a list into), in the same order. A rule one rendering has and the
// other lacks, a list item missing from a set or a multiport group, or a different order fails.
func TestRenderingsAgree(t *testing.T) {
	for name, c := range GoldenConfigs() {
		t.Run(name, func(t *testing.T) {
			rs := mustBuild(t, c)
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
	ports                       []NFTInterval
	addrs                       []NFTInterval
	addrType                    NFTSetType
}

func (d decision) String() string {
	var ps, as []string
	for _, iv := range NormalizeIntervals(d.ports) {
		ps = append(ps, NFTPorts.ElementString(iv))
	}
	for _, iv := range NormalizeIntervals(d.addrs) {
		as = append(as, d.addrType.ElementString(iv))
	}
	return fmt.Sprintf("%s %s %s [%s] ports=%v addrs=%v", d.chain, d.kind, d.verdict, d.match, ps, as)
}

// merge appends d to out, folding it into the previous decision when both are parts of one
// list (same chain, kind, verdict and other matches).
func merge(out []decision, d decision) []decision {
	if n := len(out); n > 0 {
		p := &out[n-1]
		if p.chain == d.chain && p.kind == d.kind && p.verdict == d.verdict && p.match == d.match && p.addrType == d.addrType {
			p.ports = append(p.ports, d.ports...)
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

func xtDecisions(rs *Ruleset, f Family) []string {
	typ := NFTIPv4
	if f == IPv6 {
		typ = NFTIPv6
	}
	var out []decision
	for _, r := range rs.XTChainRules(f) {
		d := decision{chain: r.Chain, kind: commentKind(r.Comment), verdict: r.Target}
		if r.Target == TargetRedirect {
			d.verdict += fmt.Sprintf(" %d", r.ToPort)
		}
		var m []string
		if r.TCP && len(r.MultiportDPorts) == 0 && r.DPort.First == 0 {
			m = append(m, "tcp")
		}
		if r.UIDOwner != nil {
			m = append(m, fmt.Sprintf("uid %d", *r.UIDOwner))
		}
		if r.GIDOwner != nil {
			m = append(m, fmt.Sprintf("gid %d", *r.GIDOwner))
		}
		if r.OutInterface != "" {
			m = append(m, "oif "+r.OutInterface)
		}
		d.match = strings.Join(m, " ")
		d.ports = portIntervals(append(slices.Clone(r.MultiportDPorts), nonZero(r.DPort)...))
		for _, p := range []netip.Prefix{r.Source, r.Destination} {
			if p.IsValid() {
				d.addrs, d.addrType = prefixIntervals([]netip.Prefix{p}), typ
				if p == r.Source {
					d.match += "saddr"
				} else {
					d.match += "daddr"
				}
			}
		}
		out = merge(out, d)
	}
	return strs(out)
}

func nonZero(p PortRange) []PortRange {
	if p.First == 0 {
		return nil
	}
	return []PortRange{p}
}

func nftDecisions(t NFTTable, f Family) []string {
	sets := map[string]NFTSet{}
	for _, s := range t.Sets {
		sets[s.Name] = s
	}
	var out []decision
	for _, c := range t.Chains {
	rules:
		for _, r := range c.Rules {
			d := decision{chain: c.Name, kind: commentKind(strings.SplitN(r.Comment, ",...+", 2)[0])}
			d.verdict = "RETURN"
			if r.Verdict == NFTRedirect {
				d.verdict = fmt.Sprintf("REDIRECT %d", r.RedirectPort)
			}
			var m []string
			for _, x := range r.Matches {
				switch x.Kind {
				case NFTMatchNFProto:
					if x.Family != f {
						continue rules
					}
				case NFTMatchTCP:
					m = append(m, "tcp")
				case NFTMatchSkUID:
					m = append(m, fmt.Sprintf("uid %d", x.ID))
				case NFTMatchSkGID:
					m = append(m, fmt.Sprintf("gid %d", x.ID))
				case NFTMatchOIFName:
					m = append(m, "oif "+x.Name)
				case NFTMatchDPortSet:
					d.ports = sets[x.Set].Elements
				case NFTMatchSAddrSet, NFTMatchDAddrSet:
					if x.Family != f {
						continue rules
					}
					d.addrs, d.addrType = sets[x.Set].Elements, sets[x.Set].Type
				}
			}
			d.match = strings.Join(m, " ")
			for _, x := range r.Matches {
				if x.Kind == NFTMatchSAddrSet {
					d.match += "saddr"
				} else if x.Kind == NFTMatchDAddrSet {
					d.match += "daddr"
				}
			}
			out = merge(out, d)
		}
	}
	return strs(out)
}

func commentKind(c string) string {
	c = strings.TrimPrefix(c, CommentPrefix)
	for _, k := range []string{"ignore-port-", "ignore-subnet-", "redirect-port-"} {
		if strings.HasPrefix(c, k) {
			return k
		}
	}
	return c
}

func TestNFTSemantics(t *testing.T) {
	tests := []struct {
		name   string
		mod    func(*Config)
		chain  string
		want   []string // rule strings, without comments
		absent []string // substrings that must not appear in the script
	}{
		{
			name:  "chart defaults outbound",
			chain: OutputChain,
			want: []string{
				"meta skuid 2102 return",
				`oifname "lo" return`,
				"tcp dport @outbound_ignore_ports return",
				"meta l4proto tcp redirect to :4140",
			},
			absent: []string{"nfproto", "skgid"},
		},
		{
			name:  "ipv6 off: redirects are ipv4 only, v6 subnets dropped",
			mod:   func(c *Config) { c.IPv6 = false; c.InboundSubnetsToIgnore = []string{"2001:db8::/32,192.0.2.0/24"} },
			chain: RedirectChain,
			want: []string{
				"tcp dport @inbound_ignore_ports return",
				"ip saddr @inbound_ignore_subnets_v4 return",
				"meta nfproto ipv4 meta l4proto tcp redirect to :4143",
			},
			absent: []string{"ipv6_addr", "2001:db8"},
		},
		{
			name:  "redirect listed",
			mod:   func(c *Config) { c.PortsToRedirect = []string{"80,443"}; c.InboundPortsToIgnore = nil },
			chain: RedirectChain,
			want:  []string{"tcp dport @inbound_redirect_ports redirect to :4143"},
		},
		{
			name:  "gid and outbound subnets, both families",
			mod:   func(c *Config) { c.ProxyGID = 7; c.OutboundSubnetsToIgnore = []string{"2001:db8::1", "192.0.2.1"} },
			chain: OutputChain,
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
			c := chartConfig()
			if tt.mod != nil {
				tt.mod(&c)
			}
			rs := mustBuild(t, c)
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
			script := rs.NFTScript()
			for _, a := range tt.absent {
				if strings.Contains(script, a) {
					t.Errorf("script contains %q:\n%s", a, script)
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
		mod   func(*Config)
		set   string
		elems string
	}{
		{"adjacent ports merge", func(c *Config) {}, "inbound_ignore_ports", "4190-4191, 4567-4568"},
		{"overlapping ranges merge and sort", func(c *Config) { c.InboundPortsToIgnore = []string{"9000,1000-2000,1500-2500,2501,65535"} },
			"inbound_ignore_ports", "1000-2501, 9000, 65535"},
		{"contained and adjacent subnets", func(c *Config) {
			c.OutboundSubnetsToIgnore = []string{"192.0.2.0/25,192.0.2.128/25,192.0.2.7,203.0.113.0/30,203.0.113.4"}
		}, "outbound_ignore_subnets_v4", "192.0.2.0/24, 203.0.113.0-203.0.113.4"},
		{"v6 host and prefix", func(c *Config) { c.OutboundSubnetsToIgnore = []string{"2001:db8::1,2001:db8:1::/48"} },
			"outbound_ignore_subnets_v6", "2001:db8::1, 2001:db8:1::/48"},
		{"everything", func(c *Config) { c.InboundSubnetsToIgnore = []string{"0.0.0.0/0,10.0.0.0/8"} },
			"inbound_ignore_subnets_v4", "0.0.0.0/0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := chartConfig()
			tt.mod(&c)
			tbl := mustBuild(t, c).NFT()
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

func TestIncrement(t *testing.T) {
	tests := []struct {
		in, want []byte
		overflow bool
	}{
		{[]byte{0, 0}, []byte{0, 1}, false},
		{[]byte{0, 0xff}, []byte{1, 0}, false},
		{[]byte{0xff, 0xff}, []byte{0, 0}, true},
	}
	for _, tt := range tests {
		got, of := Increment(tt.in)
		if string(got) != string(tt.want) || of != tt.overflow {
			t.Errorf("Increment(%x) = %x,%v; want %x,%v", tt.in, got, of, tt.want, tt.overflow)
		}
	}
}

func TestListCommentFitsNFT(t *testing.T) {
	var many []string
	for i := range 1000 {
		many = append(many, netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}).String()+"/24")
	}
	tests := []struct {
		name   string
		items  []string
		want   string
		prefix string
	}{
		{"short list is verbatim", []string{"4190", "4191"}, "proxy-init/ignore-port-4190,4191", ""},
		{"long list is cut with a count", many, "", "proxy-init/ignore-subnet-10.0.0.0/24,10.0.1.0/24,"},
		{"one huge item", []string{strings.Repeat("x", 200)}, "proxy-init/ignore-subnet-1-items", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "ignore-port-"
			if tt.want == "" || strings.Contains(tt.want, "subnet") {
				prefix = "ignore-subnet-"
			}
			got := listComment(Step{Kind: StepIgnorePorts, Name: prefix}, len(tt.items), func(i int) string { return tt.items[i] })
			if len(got) > NFTCommentMax {
				t.Errorf("len %d > %d: %s", len(got), NFTCommentMax, got)
			}
			if tt.want != "" && got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			if tt.prefix != "" && (!strings.HasPrefix(got, tt.prefix) || !strings.Contains(got, ",...+")) {
				t.Errorf("got %q, want prefix %q and a ...+N marker", got, tt.prefix)
			}
		})
	}
}

// Only the items that can appear in the comment are rendered, however long the list.
func TestListCommentRendersFewItems(t *testing.T) {
	calls := 0
	c := listComment(Step{Kind: StepIgnoreSubnets, Name: "ignore-subnet-"}, 10000, func(i int) string { calls++; return "10.0.0.0/24" })
	if calls > NFTCommentMax/2 {
		t.Errorf("rendered %d items for a %d-byte comment", calls, NFTCommentMax)
	}
	if !strings.HasSuffix(c, ",...+"+strconv.Itoa(10000-strings.Count(c, "/24"))) {
		t.Errorf("comment %q does not count the items left out", c)
	}
}

func TestCompareNFT(t *testing.T) {
	rs := mustBuild(t, chartConfig())
	want := rs.NFT()
	if d := CompareNFT(want, &want); !d.Empty() {
		t.Fatalf("identical tables differ: %s", d)
	}
	if d := CompareNFT(want, nil); len(d.Missing) != len(want.Statements()) {
		t.Errorf("absent table: %d missing, want %d", len(d.Missing), len(want.Statements()))
	}
	// A dropped rule and a changed set element are both reported, in nft syntax.
	have := rs.NFT()
	have.Chains[1].Rules = have.Chains[1].Rules[1:]
	have.Sets[0].Elements = have.Sets[0].Elements[:1]
	d := CompareNFT(want, &have)
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
	if d := CompareNFT(want, &have); !d.Reordered {
		t.Errorf("swapped rules not reported as reordered: %s", d)
	}
}

func TestNFTCommentRecordsPlan(t *testing.T) {
	a := mustBuild(t, chartConfig())
	c := chartConfig()
	c.OutboundPortsToIgnore = []string{"443"}
	b := mustBuild(t, c)
	if a.NFTComment() == b.NFTComment() {
		t.Errorf("different plans share the comment %q", a.NFTComment())
	}
	if !strings.Contains(a.NFTScript(), fmt.Sprintf("comment %q", a.NFTComment())) {
		t.Errorf("script does not record the plan")
	}
}
