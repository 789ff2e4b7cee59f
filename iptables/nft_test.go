package iptables

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

func TestGoldenNFTScripts(t *testing.T) {
	for name, c := range goldenConfigs() {
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

// The nft rules carry the iptables rule names, in the iptables order, for every config case.
func TestNFTRulesFollowIptablesOrder(t *testing.T) {
	for name, c := range goldenConfigs() {
		t.Run(name, func(t *testing.T) {
			rs := mustBuild(t, c)
			tbl := rs.NFT()
			for _, ch := range tbl.Chains {
				// Walk the iptables rules of the chain (both families): each nft rule must
				// name the kind of the next iptables rules, in the same order.
				var xt []string
				for _, f := range rs.Families {
					for _, r := range rs.ChainRules(f) {
						if r.Chain == ch.Name {
							xt = append(xt, ruleKind(r.Spec))
						}
					}
				}
				for _, r := range ch.Rules {
					if len(r.Comment) > NFTCommentMax {
						t.Errorf("comment %q longer than %d", r.Comment, NFTCommentMax)
					}
					kind := commentKind(r.Comment)
					found := false
					for len(xt) > 0 && !found {
						found = xt[0] == kind
						xt = xt[1:]
					}
					if !found {
						t.Errorf("%s: rule %q has no iptables counterpart in order", ch.Name, r)
					}
				}
			}
		})
	}
}

// ruleKind returns the comment of an iptables rule without its list part: "ignore-port",
// "ignore-subnet", "redirect-port" or the full name.
func ruleKind(spec string) string {
	_, after, _ := strings.Cut(spec, `--comment "`)
	name, _, _ := strings.Cut(after, `"`)
	return commentKind(name)
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
			got := listComment(prefix, len(tt.items), func(i int) string { return tt.items[i] }, "")
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
	c := listComment("ignore-subnet-", 10000, func(i int) string { calls++; return "10.0.0.0/24" }, "")
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
