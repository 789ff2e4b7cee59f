package iptables

// GoldenConfigs returns the config matrix every renderer and backend is checked against: the
// golden files of this package, and the root tests that hold what a backend writes equal to what
// the iptables tools write for the same config. It is exported for those tests; nothing else
// calls it.
func GoldenConfigs() map[string]Config {
	chart := func() Config {
		c := NewConfig()
		c.InboundProxyPort, c.OutboundProxyPort, c.ProxyUID = 4143, 4140, 2102
		c.InboundPortsToIgnore = []string{"4190,4191,4567,4568"}
		c.OutboundPortsToIgnore = []string{"4567,4568"}
		return c
	}
	cases := map[string]Config{"chart-defaults": chart()}

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
	return cases
}
