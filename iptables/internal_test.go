package iptables

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"
)

func TestMultiportGroups(t *testing.T) {
	tests := []struct {
		ports []PortRange
		want  []string
	}{
		{nil, nil},
		{[]PortRange{{1, 1}, {2, 5}}, []string{"1,2:5"}},
		// 13 singles + a range is 15: one rule; one more single spills over.
		{append(singles(1, 13), PortRange{20, 30}), []string{"1,2,3,4,5,6,7,8,9,10,11,12,13,20:30"}},
		{append(singles(1, 14), PortRange{20, 30}), []string{"1,2,3,4,5,6,7,8,9,10,11,12,13,14", "20:30"}},
		{singles(1, 16), []string{"1,2,3,4,5,6,7,8,9,10,11,12,13,14,15", "16"}},
	}
	for _, tc := range tests {
		var got []string
		for _, g := range multiportGroups(tc.ports) {
			got = append(got, joinXTPorts(g))
		}
		if strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("multiportGroups(%v) = %v, want %v", tc.ports, got, tc.want)
		}
	}
}

func singles(from, to int) []PortRange {
	var out []PortRange
	for p := from; p <= to; p++ {
		out = append(out, PortRange{uint16(p), uint16(p)})
	}
	return out
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
			got := listComment(StepCommon{Name: prefix}, len(tt.items), func(i int) string { return tt.items[i] })
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
	c := listComment(StepCommon{Name: "ignore-subnet-"}, 10000, func(i int) string { calls++; return "10.0.0.0/24" })
	if calls > NFTCommentMax/2 {
		t.Errorf("rendered %d items for a %d-byte comment", calls, NFTCommentMax)
	}
	if !strings.HasSuffix(c, ",...+"+strconv.Itoa(10000-strings.Count(c, "/24"))) {
		t.Errorf("comment %q does not count the items left out", c)
	}
}
