// Package iptablestest holds what the tests of the rule builder, the backends and their callers
// share: the config matrix every rendering and backend is checked against, the Linkerd chart's
// configuration, the nft script of a table (what `nft -f` is given to compare with our netlink
// writer), and Fake, an in-memory Applier. Only tests import it; the dead-code check in
// `make test` lists it as such.
package iptablestest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
)

// ChartConfig is what the Linkerd chart passes to proxy-init by default: inbound 4143, outbound
// 4140, proxy UID 2102, and the admin and tap ports skipped.
func ChartConfig() iptables.Config {
	c := iptables.NewConfig()
	c.InboundProxyPort, c.OutboundProxyPort, c.ProxyUID = 4143, 4140, 2102
	c.InboundPortsToIgnore = []string{"4190,4191,4567,4568"}
	c.OutboundPortsToIgnore = []string{"4567,4568"}
	return c
}

// GoldenConfigs returns the config matrix every renderer and backend is checked against: the
// golden files of package iptables and iptables/nfnl, and the root tests that hold what a backend
// writes equal to what the iptables tools write for the same config.
func GoldenConfigs() map[string]iptables.Config {
	chart := ChartConfig
	cases := map[string]iptables.Config{"chart-defaults": chart()}

	c := chart()
	c.PortsToRedirect = []string{"8080,9090", "10000-10010"}
	cases["redirect-listed"] = c

	c = chart()
	c.InboundPortsToIgnore = []string{"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17"}
	c.OutboundPortsToIgnore = []string{"21,22,23,24,25,26,27,28,29,30,31,32,33,34,35"}
	cases["more-than-15-ports"] = c

	c = chart()
	c.InboundPortsToIgnore = []string{"4190-4191,5000", "6000-7000,8000-9000,10000-11000,12000-13000,14000-15000,16000-17000,18000-19000"}
	c.OutboundPortsToIgnore = []string{"25-26"}
	cases["ranges"] = c

	c = chart()
	c.ProxyGID = 2103
	cases["uid-and-gid"] = c

	c = chart()
	c.InboundSubnetsToIgnore = []string{"198.51.100.0/24,2001:db8:1::/48", "203.0.113.7"}
	c.OutboundSubnetsToIgnore = []string{"192.0.2.0/25", "2001:db8:2::/64,2001:db8:3::1"}
	cases["mixed-subnets"] = c

	c = chart()
	c.IPv6 = false
	c.InboundSubnetsToIgnore = []string{"198.51.100.0/24", "2001:db8:1::/48"}
	cases["ipv6-off"] = c

	c = chart()
	c.OutboundPortsToIgnore = []string{"443,6443"}
	cases["control-plane"] = c

	// The features beyond Linkerd's, one by one, then all at once.
	c = chart()
	c.RedirectDNSToPort = 5353
	cases["dns"] = c

	c = chart()
	c.ProxyGID = 2103
	c.RedirectDNSToPort = 5353
	c.DNSServersOnly, c.DNSServers = true, []string{"192.0.2.53", "2001:db8::53", "198.51.100.53"}
	cases["dns-servers-only"] = c

	c = chart()
	c.InboundMode = iptables.InboundTPROXY
	c.InboundSubnetsToIgnore = []string{"198.51.100.0/24,2001:db8:1::/48"}
	cases["tproxy"] = c

	c = chart()
	c.InboundMode = iptables.InboundTPROXY
	c.PortsToRedirect = []string{"8080,9090"}
	cases["tproxy-listed"] = c

	c = chart()
	c.OutboundPortsToRedirect = []string{"80,443", "8000-8100"}
	cases["outbound-ports-to-redirect"] = c

	c = chart()
	c.OutboundSubnetsToRedirect = []string{"10.0.0.0/8,192.0.2.0/24", "2001:db8:5::/48"}
	cases["outbound-subnets-to-redirect"] = c

	c = chart()
	c.OutboundPortsToRedirect = []string{"80,443"}
	c.OutboundSubnetsToRedirect = []string{"10.0.0.0/8,192.0.2.0/24"}
	cases["outbound-both-to-redirect"] = c

	c = chart()
	c.InterfacesToIgnore = []string{"net1,eth1"}
	cases["interfaces-to-ignore"] = c

	c = chart()
	c.UIDsToIgnore = []string{"1000,1001"}
	c.GIDsToIgnore = []string{"3000"}
	cases["ids-to-ignore"] = c

	c = chart()
	c.DropInvalid = true
	cases["drop-invalid"] = c

	// A KubeVirt virtual machine's interfaces: its outbound TCP goes to the outbound port, with
	// the outbound lists, and never the inbound ones.
	c = chart()
	c.RerouteVirtualInterfaces = []string{"k6t-eth0,tap0"}
	c.OutboundSubnetsToIgnore = []string{"192.0.2.0/25", "2001:db8:2::/64"}
	cases["reroute-virtual-interfaces"] = c

	c = chart()
	c.RerouteVirtualInterfaces = []string{"tap0"}
	c.InboundMode = iptables.InboundTPROXY
	c.OutboundPortsToRedirect = []string{"80,443"}
	c.OutboundSubnetsToRedirect = []string{"10.0.0.0/8,2001:db8:5::/48"}
	c.IPv6 = false
	cases["reroute-virtual-interfaces-tproxy"] = c

	cases["every-feature"] = EveryFeatureConfig()

	c = EveryFeatureConfig()
	c.IPv6 = false
	cases["every-feature-ipv6-off"] = c
	return cases
}

// EveryFeatureConfig is the chart's configuration with every feature beyond Linkerd's on: what
// the bench compares with the chart's defaults.
func EveryFeatureConfig() iptables.Config {
	c := ChartConfig()
	c.ProxyGID = 2103
	c.RedirectDNSToPort = 5353
	c.DNSServersOnly, c.DNSServers = true, []string{"192.0.2.53", "2001:db8::53"}
	c.InboundMode = iptables.InboundTPROXY
	c.InboundSubnetsToIgnore = []string{"198.51.100.0/24"}
	c.OutboundPortsToRedirect = []string{"80,443,8080"}
	c.OutboundSubnetsToRedirect = []string{"10.0.0.0/8,2001:db8:5::/48"}
	c.OutboundSubnetsToIgnore = []string{"10.96.0.0/12"}
	c.InterfacesToIgnore = []string{"net1"}
	c.UIDsToIgnore = []string{"1000"}
	c.GIDsToIgnore = []string{"3000"}
	c.DropInvalid = true
	return c
}

// Build is iptables.Build for a config a test knows to be valid.
func Build(t testing.TB, c iptables.Config) *iptables.Ruleset {
	t.Helper()
	rs, err := iptables.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// CheckGolden compares got with the golden file at path (below the test's package), or rewrites
// the file when update is set: each package with golden files has an -update flag, and pkg is
// the package path its hint names (go test ./pkg -update).
func CheckGolden(t testing.TB, path, got string, update bool, pkg string) {
	t.Helper()
	if update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (go test ./%s -update writes it)", err, pkg)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (go test ./%s -update if intended):\ngot:\n%s\nwant:\n%s", path, pkg, got, want)
	}
}
