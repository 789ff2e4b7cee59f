package iptables

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current output")

// goldenConfigs is the config matrix every renderer is checked against.
func goldenConfigs() map[string]Config {
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

// checkGolden compares got with testdata/<name>, or rewrites it under -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
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
		t.Fatalf("%v (run go test ./iptables -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (run go test ./iptables -update if intended):\ngot:\n%s\nwant:\n%s", path, got, want)
	}
}

func TestGoldenRestorePayloads(t *testing.T) {
	for name, c := range goldenConfigs() {
		t.Run(name, func(t *testing.T) {
			rs, err := Build(c)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []Family{IPv4, IPv6} {
				got := "# " + string(f) + ": not written\n"
				if rs.HasFamily(f) {
					got = rs.Payload(f, SavedState{})
					if viaSaved := TransitionPayload(SavedState{}, rs.Saved(f)); got != viaSaved {
						t.Errorf("%s: Payload differs from TransitionPayload of Saved:\n%s\nwant:\n%s", f, got, viaSaved)
					}
				}
				checkGolden(t, filepath.Join("iptables", name+"."+string(f)+".rules"), got)
			}
		})
	}
}
