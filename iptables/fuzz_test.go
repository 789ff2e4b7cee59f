package iptables

import (
	"strings"
	"testing"
)

// The parsers face user input from flags, JSON and pod annotations. They must never panic, and
// whatever they accept must round-trip and be within range.

func FuzzParsePorts(f *testing.F) {
	for _, s := range []string{"4190,4191", "1000-2000", "", " 80 ", "0", "65536", "5-1", "1-", "-1", "80,,81", "1-65535"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ports, err := ParsePorts(s)
		if err != nil {
			return
		}
		var parts []string
		for _, p := range ports {
			if p.First == 0 || p.Last < p.First {
				t.Fatalf("ParsePorts(%q) accepted %v", s, p)
			}
			parts = append(parts, p.String())
		}
		again, err := ParsePorts(strings.Join(parts, ","))
		if err != nil || len(again) != len(ports) {
			t.Fatalf("round trip of %q failed: %v %v", s, again, err)
		}
	})
}

func FuzzParseCIDR(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "2001:db8::/32", "192.0.2.1", "::1", "10.0.0.0/33", "::ffff:1.2.3.4/128", "fe80::1%eth0", "", "1.2.3.4/8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseCIDR(s)
		if err != nil {
			return
		}
		if !p.IsValid() || p != p.Masked() || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			t.Fatalf("ParseCIDR(%q) accepted %v", s, p)
		}
		again, err := ParseCIDR(p.String())
		if err != nil || again != p {
			t.Fatalf("round trip of %q: %v %v", s, again, err)
		}
	})
}
