package iptables_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

// The parsers face user input from flags, JSON and pod annotations. They must never panic, and
// whatever they accept must round-trip and be within range.

// FuzzParsePorts fuzzes a port list the way every front end parses one: as a value of a Config
// field, through Build.
func FuzzParsePorts(f *testing.F) {
	for _, s := range []string{"4190,4191", "1000-2000", "", " 80 ", "0", "65536", "5-1", "1-", "-1", "80,,81", "1-65535", "80,80,81-82"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		c := iptablestest.ChartConfig()
		c.InboundPortsToIgnore = []string{s}
		rs, err := iptables.Build(c)
		if err != nil {
			v, ok := badinput.As(err)
			if !ok || len(v.Problems) == 0 {
				t.Fatalf("Build with ports %q failed with %v, not bad input", s, err)
			}
			for _, p := range v.Problems {
				if p.Field != iptables.FieldInboundPortsToIgnore {
					t.Fatalf("ports %q: a problem with another field: %+v", s, p)
				}
			}
			return
		}
		var parts []string
		for _, p := range rs.InboundIgnorePorts {
			if p.First == 0 || p.Last < p.First {
				t.Fatalf("ports %q: accepted %v", s, p)
			}
			parts = append(parts, p.String())
		}
		c.InboundPortsToIgnore = []string{strings.Join(parts, ",")}
		again, err := iptables.Build(c)
		if err != nil || !slices.Equal(again.InboundIgnorePorts, rs.InboundIgnorePorts) {
			t.Fatalf("round trip of %q: %v, %v", s, again, err)
		}
	})
}

func FuzzParseCIDR(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "2001:db8::/32", "192.0.2.1", "::1", "10.0.0.0/33", "::ffff:1.2.3.4/128", "fe80::1%eth0", "", "1.2.3.4/8"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := iptables.ParseCIDR(s)
		if err != nil {
			return
		}
		if !p.IsValid() || p != p.Masked() || p.Addr().Zone() != "" || p.Addr().Is4In6() {
			t.Fatalf("ParseCIDR(%q) accepted %v", s, p)
		}
		again, err := iptables.ParseCIDR(p.String())
		if err != nil || again != p {
			t.Fatalf("round trip of %q: %v %v", s, again, err)
		}
	})
}
