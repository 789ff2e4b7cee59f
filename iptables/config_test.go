package iptables_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

func TestBuildReportsEveryProblem(t *testing.T) {
	c := iptables.NewConfig()
	c.InboundProxyPort = 70000
	c.ProxyUID = 0
	c.ProxyGID = -5
	c.PortsToRedirect = []string{"0"}
	c.InboundPortsToIgnore = []string{"4190,,4191", "200-100"}
	c.OutboundPortsToIgnore = []string{"80-x", "65536"}
	c.InboundSubnetsToIgnore = []string{"10.0.0.0/33"}
	c.OutboundSubnetsToIgnore = []string{"::ffff:10.0.0.0/104", "fe80::1%eth0"}
	c.Mode = "iptables-magic"

	rs, err := iptables.Build(c)
	if _, ok := badinput.As(err); !ok || rs != nil {
		t.Fatalf("want a *badinput.Error and no rules, got %v, %v", rs, err)
	}
	want := []string{
		`incoming-proxy-port "70000": port is outside 1-65535`,
		`outgoing-proxy-port "-1": must be set`,
		`ports-to-redirect "0": port 0 is outside 1-65535`,
		`inbound-ports-to-ignore "": empty port`,
		`inbound-ports-to-ignore "200-100": range 200-100 is reversed`,
		`outbound-ports-to-ignore "80-x": "x" is not a port number`,
		`outbound-ports-to-ignore "65536": port 65536 is outside 1-65535`,
		`subnets-to-ignore "10.0.0.0/33": "10.0.0.0/33" is not a valid CIDR`,
		`outbound-subnets-to-ignore "::ffff:10.0.0.0/104": "::ffff:10.0.0.0/104" is an IPv4-mapped IPv6 subnet; write the IPv4 subnet`,
		`outbound-subnets-to-ignore "fe80::1%eth0": "fe80::1%eth0" has a zone, which a subnet cannot have`,
		`proxy-uid "0": refusing to exempt UID 0 (root): use -1 for no exemption`,
		`proxy-gid "-5": must be -1 (none) or a GID from 1 to 4294967294`,
		`iptables-mode "iptables-magic": unknown mode; want one of auto, legacy, nft, plain, nftables`,
	}
	msg := err.Error()
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Errorf("error lacks %q\nfull error: %s", w, msg)
		}
	}
	if n := len(err.(*badinput.Error).Problems); n != len(want) {
		t.Errorf("got %d problems, want %d: %s", n, len(want), msg)
	}
}

// Every numeric bound, at and just past its edge. A UID or GID past 2^32-2 used to be accepted
// and wrapped to 0 in the nftables rules, exempting root's traffic; a close-wait timeout past
// what the kernel takes used to fail only after the rules were written.
func TestNumericBounds(t *testing.T) {
	tests := []struct {
		name string
		mod  func(*iptables.Config)
		want string // "" means valid
	}{
		{"largest uid", func(c *iptables.Config) { c.ProxyUID = 4294967294 }, ""},
		{"uid 2^32-1", func(c *iptables.Config) { c.ProxyUID = 4294967295 }, `proxy-uid "4294967295": must be -1 (none) or a UID from 1 to 4294967294`},
		{"uid 2^32 would be root", func(c *iptables.Config) { c.ProxyUID = 4294967296 }, `proxy-uid "4294967296": must be -1 (none) or a UID from 1 to 4294967294`},
		{"gid 2^32+2102", func(c *iptables.Config) { c.ProxyGID = 1<<32 + 2102 }, `proxy-gid "4294969398": must be -1 (none) or a GID from 1 to 4294967294`},
		{"uid 0", func(c *iptables.Config) { c.ProxyUID = 0 }, `proxy-uid "0": refusing to exempt UID 0 (root): use -1 for no exemption`},
		{"close-wait at the kernel's limit", func(c *iptables.Config) { c.CloseWaitSecs = 2147483 }, ""},
		{"close-wait past it", func(c *iptables.Config) { c.CloseWaitSecs = 2147484 }, `timeout-close-wait-secs "2147484": must be 0 (leave the kernel's) or 1 to 2147483 seconds, the most every kernel accepts`},
		{"close-wait that once wrapped", func(c *iptables.Config) { c.CloseWaitSecs = 18446744074 }, `timeout-close-wait-secs "18446744074": must be 0`},
		{"negative close-wait", func(c *iptables.Config) { c.CloseWaitSecs = -1 }, `timeout-close-wait-secs "-1": must be 0`},
		{"negative port", func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"-5"} }, `outbound-ports-to-ignore "-5": "-5" is not a port number or a range a-b`},
		{"range without start", func(c *iptables.Config) { c.InboundPortsToIgnore = []string{"-80"} }, `inbound-ports-to-ignore "-80": "-80" is not a port number or a range a-b`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := iptablestest.ChartConfig()
			tt.mod(&c)
			_, err := iptables.Build(c)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestBuildNormalizes(t *testing.T) {
	c := iptables.NewConfig()
	c.InboundProxyPort, c.OutboundProxyPort = 4143, 4140
	c.InboundPortsToIgnore = []string{" 4190 , 4191", "4190", ""}
	c.InboundSubnetsToIgnore = []string{"10.1.2.3/8", "10.0.0.0/8", "2001:db8::1"}
	rs, err := iptables.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	if got := rs.InboundIgnorePorts; len(got) != 2 || got[0] != (iptables.PortRange{4190, 4190}) || got[1] != (iptables.PortRange{4191, 4191}) {
		t.Errorf("ports not trimmed and deduplicated in order: %v", got)
	}
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::1/128")}
	if got := rs.InboundIgnoreSubnets; len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("subnets not masked and deduplicated: %v", got)
	}
	// Duplicates anywhere in the list, after masking, go; the first of each keeps its place.
	c.OutboundSubnetsToIgnore = []string{"203.0.113.0/24,2001:db8::/32", "198.51.100.7/32,203.0.113.9/24", "2001:db8::/32,198.51.100.7"}
	if rs, err = iptables.Build(c); err != nil {
		t.Fatal(err)
	}
	wantOut := []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("2001:db8::/32"), netip.MustParsePrefix("198.51.100.7/32")}
	if got := rs.OutboundIgnoreSubnets; !slices.Equal(got, wantOut) {
		t.Errorf("outbound subnets = %v, want %v", got, wantOut)
	}
	if got := iptables.Subnets(iptables.IPv6, rs.InboundIgnoreSubnets); len(got) != 1 || got[0] != want[1] {
		t.Errorf("IPv6 filter: %v", got)
	}
	if !rs.HasFamily(iptables.IPv6) {
		t.Error("IPv6 is on by default")
	}
}

func TestCompareAndTransition(t *testing.T) {
	c := iptables.NewConfig()
	c.InboundProxyPort, c.OutboundProxyPort = 4143, 4140
	rs, _ := iptables.Build(c)
	want := rs.Saved(iptables.IPv4)
	if d := rs.Compare(iptables.IPv4, want); !d.Empty() {
		t.Fatalf("expected state differs from itself: %s", d)
	}

	// A save with a duplicated jump, a stale rule and a missing one.
	var lines []string
	lines = append(lines, want.Rules...)
	lines = append(lines, want.Rules[0]) // duplicate PREROUTING jump
	stale := `-A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 9 -m comment --comment "proxy-init/ignore-port-9" -j RETURN`
	lines = append(lines[:3], append([]string{stale}, lines[4:]...)...)
	save := "*filter\n-A INPUT -j PROXY_INIT_OUTPUT\nCOMMIT\n*nat\n:PREROUTING ACCEPT [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n:PROXY_INIT_REDIRECT - [0:0]\n" +
		strings.Join(lines, "\n") + "\n-A POSTROUTING -j MASQUERADE\nCOMMIT\n"
	got := iptables.ParseSave(save)
	if len(got.Chains) != 2 {
		t.Errorf("chains: %v", got.Chains)
	}
	d := rs.Compare(iptables.IPv4, got)
	if len(d.Missing) != 1 || d.Missing[0] != want.Rules[3] {
		t.Errorf("missing = %q, want %q", d.Missing, want.Rules[3])
	}
	if extra := strings.Join(d.Extra, "\n"); len(d.Extra) != 2 || !strings.Contains(extra, stale) || !strings.Contains(extra, want.Rules[0]) {
		t.Errorf("extra = %q", d.Extra)
	}

	p := iptables.TransitionPayload(got, want)
	if strings.Count(p, "-D PREROUTING") != 1 || strings.Contains(p, "-A PREROUTING") || strings.Contains(p, "-A OUTPUT") {
		t.Errorf("transition should delete the duplicate jump only and keep the others in place:\n%s", p)
	}
	if strings.Contains(p, "MASQUERADE") || strings.Contains(p, "INPUT") {
		t.Errorf("transition touches rules that are not ours:\n%s", p)
	}
	clean := iptables.TransitionPayload(got, iptables.SavedState{})
	if strings.Count(clean, "-D ") != 3 || !strings.Contains(clean, "-X PROXY_INIT_REDIRECT\n") {
		t.Errorf("cleanup payload:\n%s", clean)
	}

	// Someone's own jump into our chain is theirs: not compared, kept by an apply, deleted only
	// by a cleanup (the chain it points to goes).
	user := "-A OUTPUT -d 198.51.100.0/24 -j PROXY_INIT_OUTPUT"
	withUser := iptables.ParseSave("*nat\n:PROXY_INIT_OUTPUT - [0:0]\n:PROXY_INIT_REDIRECT - [0:0]\n" + strings.Join(want.Rules, "\n") + "\n" + user + "\nCOMMIT\n")
	if !slices.Equal(withUser.ForeignJumps, []string{user}) {
		t.Errorf("foreign jumps = %q, want %q", withUser.ForeignJumps, user)
	}
	if d := rs.Compare(iptables.IPv4, withUser); !d.Empty() {
		t.Errorf("a user's own jump counts as a difference: %s", d)
	}
	if p := iptables.TransitionPayload(withUser, want); strings.Contains(p, "-D OUTPUT") {
		t.Errorf("apply deletes the user's own jump:\n%s", p)
	}
	if p := iptables.TransitionPayload(withUser, iptables.SavedState{}); !strings.Contains(p, "-D OUTPUT -d 198.51.100.0/24 -j PROXY_INIT_OUTPUT\n") {
		t.Errorf("cleanup keeps a jump into the chain it deletes:\n%s", p)
	}

	// A rule with neither matches nor target, which iptables-save prints as "-A <chain>", is
	// restored exactly as it was saved (a rollback must not alter it).
	bare := iptables.SavedState{Chains: []string{iptables.OutputChain, iptables.RedirectChain}, Rules: []string{"-A " + iptables.OutputChain}}
	if p := iptables.TransitionPayload(iptables.SavedState{}, bare); !strings.Contains(p, "\n-A "+iptables.OutputChain+"\n") {
		t.Errorf("a bare rule is not restored as saved:\n%s", p)
	}
}

// A virtual machine's interfaces are checked as interface names are, and refused where rerouting
// would fight another setting; every problem names the field and the value.
func TestRerouteVirtualInterfacesRefused(t *testing.T) {
	tests := []struct {
		name            string
		reroute, ignore []string
		want            []string
	}{
		{"names", []string{"tap0/1,a-very-long-name0", "tap+"}, nil, []string{
			`reroute-virtual-interfaces "tap0/1": holds '/', which the kernel refuses in an interface name`,
			`reroute-virtual-interfaces "a-very-long-name0": longer than 15 bytes, the kernel's limit for an interface name`,
			`reroute-virtual-interfaces "tap+": a trailing '+' is iptables' wildcard; name each interface in full`,
		}},
		{"loopback", []string{"lo"}, nil, []string{
			`reroute-virtual-interfaces "lo": the pod's own traffic, the proxy's included, arrives on it, not a virtual machine's`,
		}},
		{"also ignored", []string{"tap0,k6t-eth0"}, []string{"k6t-eth0"}, []string{
			`reroute-virtual-interfaces "k6t-eth0": also in interfaces-to-ignore: its traffic cannot both skip the proxy and reach it`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := iptablestest.ChartConfig()
			c.RerouteVirtualInterfaces, c.InterfacesToIgnore = tt.reroute, tt.ignore
			rs, err := iptables.Build(c)
			e, ok := badinput.As(err)
			if !ok || rs != nil {
				t.Fatalf("want a *badinput.Error and no rules, got %v, %v", rs, err)
			}
			var got []string
			for _, p := range e.Problems {
				got = append(got, p.String())
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("problems:\n%q\nwant:\n%q", got, tt.want)
			}
		})
	}
	// Repeats go, the first of each keeping its place.
	c := iptablestest.ChartConfig()
	c.RerouteVirtualInterfaces = []string{"tap0, k6t-eth0", "tap0"}
	if rs := iptablestest.Build(t, c); !slices.Equal(rs.RerouteInterfaces, []string{"tap0", "k6t-eth0"}) {
		t.Errorf("rerouted interfaces = %q", rs.RerouteInterfaces)
	}
}
