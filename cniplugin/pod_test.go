package cniplugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/iptables"
)

func containers(names ...string) []Container {
	var out []Container
	for _, n := range names {
		out = append(out, Container{Name: n})
	}
	return out
}

func TestClassify(t *testing.T) {
	nativeProxy := Container{Name: ProxyContainerName, RestartPolicy: RestartPolicyAlways}
	tests := []struct {
		name string
		spec PodSpec
		want Kind
	}{
		{"no containers", PodSpec{}, KindUnmeshed},
		{"app only", PodSpec{Containers: containers("app")}, KindUnmeshed},
		{"proxy-like name", PodSpec{Containers: containers("app", "linkerd-proxy-x")}, KindUnmeshed},
		{"classic sidecar", PodSpec{Containers: containers("app", "linkerd-proxy")}, KindMeshed},
		{"native sidecar", PodSpec{InitContainers: []Container{nativeProxy}, Containers: containers("app")}, KindNativeSidecar},
		{"proxy init container without restartPolicy", PodSpec{InitContainers: containers("linkerd-proxy"), Containers: containers("app")}, KindMeshed},
		{"linkerd-init with classic proxy", PodSpec{InitContainers: containers("linkerd-init"), Containers: containers("app", "linkerd-proxy")}, KindLinkerdInit},
		{"linkerd-init after native proxy", PodSpec{InitContainers: []Container{nativeProxy, {Name: "linkerd-init"}}}, KindLinkerdInit},
		{"linkerd-init only", PodSpec{InitContainers: containers("linkerd-init"), Containers: containers("app")}, KindLinkerdInit},
		{"validator is not a proxy", PodSpec{InitContainers: containers("linkerd-network-validator"), Containers: containers("app")}, KindUnmeshed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(&tt.spec); got != tt.want {
				t.Errorf("Classify = %s, want %s", got, tt.want)
			}
			if got := tt.want.NeedsRules(); got != (tt.want == KindMeshed || tt.want == KindNativeSidecar) {
				t.Errorf("NeedsRules(%s) = %v", tt.want, got)
			}
		})
	}
}

func TestNeedsNamespace(t *testing.T) {
	all := map[string]string{}
	for _, a := range Annotations {
		all[a] = "1"
	}
	if NeedsNamespace(all) {
		t.Error("a pod with every annotation still asks for its namespace")
	}
	all[AnnotationProxyGID] = ""
	if !NeedsNamespace(all) {
		t.Error("an empty annotation counts as missing, as in Linkerd")
	}
	if !NeedsNamespace(nil) {
		t.Error("a pod without annotations must look at its namespace")
	}
}

func baseConfig() iptables.Config {
	return iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1,
		InboundPortsToIgnore: []string{"4191", "4190"}, OutboundPortsToIgnore: []string{"25"},
		InboundSubnetsToIgnore: []string{"10.0.0.0/8"}, Mode: iptables.ModeNFTables}
}

// TestMergeLeavesBaseAlone: the agent's concurrent writes share one node config, whose linkerd
// block is Merge's base, so Merge and the rule builder must never write into base's lists, not
// even into their spare capacity, whatever the annotations append or replace.
func TestMergeLeavesBaseAlone(t *testing.T) {
	base := baseConfig()
	spare := func(s ...string) []string { return append(make([]string, 0, 8), s...) }
	base.InboundPortsToIgnore, base.OutboundPortsToIgnore = spare("4191", "4190"), spare("25")
	base.InboundSubnetsToIgnore, base.OutboundSubnetsToIgnore = spare("10.0.0.0/8"), spare("192.0.2.0/24")
	base.RerouteVirtualInterfaces = spare("tap0")
	lists := []*[]string{&base.InboundPortsToIgnore, &base.OutboundPortsToIgnore, &base.InboundSubnetsToIgnore,
		&base.OutboundSubnetsToIgnore, &base.RerouteVirtualInterfaces}
	before := make([][]string, len(lists))
	for i, l := range lists {
		before[i] = slices.Clone((*l)[:cap(*l)])
	}
	pod := Object{Kind: "pod", Name: "web/api-0", Annotations: map[string]string{
		AnnotationSkipInboundPorts: "9090", AnnotationSkipOutboundPorts: "3306", AnnotationSkipSubnets: "198.51.100.0/24",
		AnnotationSkipInboundSubnets: "203.0.113.0/24", AnnotationSkipOutboundSubnets: "2001:db8::/32",
		AnnotationRerouteVirtualInterfaces: "k6t-eth0"}}
	for range 2 {
		if _, err := Merge(base, DefaultCeilings, pod, nil, []string{"6443"}); err != nil {
			t.Fatal(err)
		}
	}
	for i, l := range lists {
		if got := (*l)[:cap(*l)]; !slices.Equal(got, before[i]) {
			t.Errorf("base list %d written: %q, was %q", i, got, before[i])
		}
	}
}

func TestMerge(t *testing.T) {
	pod := func(a map[string]string) Object { return Object{Kind: "pod", Name: "web/api-0", Annotations: a} }
	ns := func(a map[string]string) *Object { return &Object{Kind: "namespace", Name: "web", Annotations: a} }
	tests := []struct {
		name     string
		pod      Object
		ns       *Object
		apiPorts []string
		// edit turns the base config into the expected one.
		edit    func(c *iptables.Config)
		sources map[string]string
	}{
		{name: "no annotations", pod: pod(nil), ns: ns(nil), edit: func(*iptables.Config) {}},
		{name: "skip-outbound-ports replaces", pod: pod(map[string]string{AnnotationSkipOutboundPorts: "3306, 5432-5440"}),
			edit:    func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"3306", "5432-5440"} },
			sources: map[string]string{"outbound-ports-to-ignore": "annotation config.linkerd.io/skip-outbound-ports on pod web/api-0"}},
		{name: "skip-inbound-ports appends", pod: pod(map[string]string{AnnotationSkipInboundPorts: "9090,9091"}),
			edit:    func(c *iptables.Config) { c.InboundPortsToIgnore = []string{"4191", "4190", "9090", "9091"} },
			sources: map[string]string{"inbound-ports-to-ignore": "annotation config.linkerd.io/skip-inbound-ports on pod web/api-0"}},
		{name: "skip-subnets replaces", pod: pod(map[string]string{AnnotationSkipSubnets: "192.0.2.0/24,2001:db8::/32"}),
			edit:    func(c *iptables.Config) { c.InboundSubnetsToIgnore = []string{"192.0.2.0/24", "2001:db8::/32"} },
			sources: map[string]string{"subnets-to-ignore": "annotation config.linkerd.io/skip-subnets on pod web/api-0"}},
		{name: "ids and proxy ports override", pod: pod(map[string]string{AnnotationProxyUID: "3000", AnnotationProxyGID: "3001",
			AnnotationInboundPort: "5143", AnnotationOutboundPort: "5140"}),
			edit: func(c *iptables.Config) {
				c.ProxyUID, c.ProxyGID, c.InboundProxyPort, c.OutboundProxyPort = 3000, 3001, 5143, 5140
			},
			sources: map[string]string{"proxy-uid": "annotation config.linkerd.io/proxy-uid on pod web/api-0",
				"proxy-gid": "annotation config.linkerd.io/proxy-gid on pod web/api-0", "incoming-proxy-port": "annotation config.linkerd.io/inbound-port on pod web/api-0",
				"outgoing-proxy-port": "annotation config.linkerd.io/outbound-port on pod web/api-0"}},
		{name: "close-wait duration", pod: pod(map[string]string{AnnotationCloseWaitTimeout: "1m30.5s"}),
			edit:    func(c *iptables.Config) { c.CloseWaitSecs = 90 },
			sources: map[string]string{"timeout-close-wait-secs": "annotation config.linkerd.io/close-wait-timeout on pod web/api-0"}},
		{name: "close-wait seconds", pod: pod(map[string]string{AnnotationCloseWaitTimeout: "120"}),
			edit:    func(c *iptables.Config) { c.CloseWaitSecs = 120 },
			sources: map[string]string{"timeout-close-wait-secs": "annotation config.linkerd.io/close-wait-timeout on pod web/api-0"}},
		{name: "inherited from the namespace", pod: pod(nil),
			ns: ns(map[string]string{AnnotationSkipOutboundPorts: "3306", AnnotationSkipInboundPorts: "9090", AnnotationProxyUID: "3000"}),
			edit: func(c *iptables.Config) {
				c.OutboundPortsToIgnore = []string{"3306"}
				c.InboundPortsToIgnore = []string{"4191", "4190", "9090"}
				c.ProxyUID = 3000
			},
			sources: map[string]string{"outbound-ports-to-ignore": "annotation config.linkerd.io/skip-outbound-ports on namespace web",
				"inbound-ports-to-ignore": "annotation config.linkerd.io/skip-inbound-ports on namespace web",
				"proxy-uid":               "annotation config.linkerd.io/proxy-uid on namespace web"}},
		{name: "pod wins over namespace; empty pod value falls back", pod: pod(map[string]string{AnnotationSkipOutboundPorts: "3306", AnnotationProxyUID: ""}),
			ns: ns(map[string]string{AnnotationSkipOutboundPorts: "9999", AnnotationProxyUID: "3000"}),
			edit: func(c *iptables.Config) {
				c.OutboundPortsToIgnore = []string{"3306"}
				c.ProxyUID = 3000
			},
			sources: map[string]string{"outbound-ports-to-ignore": "annotation config.linkerd.io/skip-outbound-ports on pod web/api-0",
				"proxy-uid": "annotation config.linkerd.io/proxy-uid on namespace web"}},
		{name: "control plane appends API ports after the override", pod: pod(map[string]string{AnnotationSkipOutboundPorts: "3306"}),
			apiPorts: []string{"443", "6443"},
			edit:     func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"3306", "443", "6443"} },
			sources:  map[string]string{"outbound-ports-to-ignore": "annotation config.linkerd.io/skip-outbound-ports on pod web/api-0"}},
		{name: "skip-outbound-subnets replaces", pod: pod(map[string]string{AnnotationSkipOutboundSubnets: "198.51.100.0/24, 2001:db8:1::/48"}),
			edit:    func(c *iptables.Config) { c.OutboundSubnetsToIgnore = []string{"198.51.100.0/24", "2001:db8:1::/48"} },
			sources: map[string]string{"outbound-subnets-to-ignore": "annotation config.linkerd.io/skip-outbound-subnets on pod web/api-0"}},
		{name: "skip-inbound-subnets appends", pod: pod(map[string]string{AnnotationSkipInboundSubnets: "192.0.2.0/24"}),
			edit:    func(c *iptables.Config) { c.InboundSubnetsToIgnore = []string{"10.0.0.0/8", "192.0.2.0/24"} },
			sources: map[string]string{"subnets-to-ignore": "annotation config.linkerd.io/skip-inbound-subnets on pod web/api-0"}},
		{name: "skip-inbound-subnets appends to skip-subnets", pod: pod(map[string]string{AnnotationSkipSubnets: "203.0.113.0/24"}),
			ns: ns(map[string]string{AnnotationSkipInboundSubnets: "192.0.2.0/24", AnnotationSkipOutboundSubnets: "198.51.100.0/24"}),
			edit: func(c *iptables.Config) {
				c.InboundSubnetsToIgnore = []string{"203.0.113.0/24", "192.0.2.0/24"}
				c.OutboundSubnetsToIgnore = []string{"198.51.100.0/24"}
			},
			sources: map[string]string{
				"subnets-to-ignore":          "annotation config.linkerd.io/skip-subnets on pod web/api-0, annotation config.linkerd.io/skip-inbound-subnets on namespace web",
				"outbound-subnets-to-ignore": "annotation config.linkerd.io/skip-outbound-subnets on namespace web"}},
		{name: "reroute-virtual-interfaces replaces", pod: pod(map[string]string{AnnotationRerouteVirtualInterfaces: "k6t-eth0, tap0"}),
			edit:    func(c *iptables.Config) { c.RerouteVirtualInterfaces = []string{"k6t-eth0", "tap0"} },
			sources: map[string]string{"reroute-virtual-interfaces": "annotation config.linkerd.io/reroute-virtual-interfaces on pod web/api-0"}},
		{name: "reroute-virtual-interfaces from the namespace", pod: pod(nil), ns: ns(map[string]string{AnnotationRerouteVirtualInterfaces: "tap0"}),
			edit:    func(c *iptables.Config) { c.RerouteVirtualInterfaces = []string{"tap0"} },
			sources: map[string]string{"reroute-virtual-interfaces": "annotation config.linkerd.io/reroute-virtual-interfaces on namespace web"}},
		{name: "unrelated annotations ignored", pod: pod(map[string]string{"config.linkerd.io/skip-all-subnets": "junk", "linkerd.io/inject": "enabled"}),
			edit: func(*iptables.Config) {}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			base := baseConfig()
			got, err := Merge(base, DefaultCeilings, tt.pod, tt.ns, tt.apiPorts)
			if err != nil {
				t.Fatal(err)
			}
			want := baseConfig()
			tt.edit(&want)
			if !reflect.DeepEqual(got.Config, want) {
				t.Errorf("config\n got %+v\nwant %+v", got.Config, want)
			}
			if !reflect.DeepEqual(base, baseConfig()) {
				t.Errorf("Merge modified its base config: %+v", base)
			}
			if tt.sources == nil {
				tt.sources = map[string]string{}
			}
			if !reflect.DeepEqual(got.Sources, tt.sources) {
				t.Errorf("sources\n got %v\nwant %v", got.Sources, tt.sources)
			}
			if rs, err := iptables.Build(got.Config); err != nil {
				t.Errorf("merged config does not build: %v", err)
			} else if got.Rules == nil || got.Rules.Hash() != rs.Hash() {
				t.Errorf("Merge's rules are not those of its config")
			}
		})
	}
}

// kernelBoundsOnly lifts the network config's ceilings above what the kernel takes, so that the
// rule builder's own bounds are what a test meets.
var kernelBoundsOnly = Ceilings{MaxCloseWaitSecs: math.MaxInt64, MaxListEntries: math.MaxInt}

// TestMergeCeilings: a pod author's values beyond the node's ceilings are refused, on the pod and
// on its namespace alike, naming the annotation and the ceiling; a list is not echoed back.
func TestMergeCeilings(t *testing.T) {
	many := strings.TrimSuffix(strings.Repeat("192.0.2.1/32,", 1025), ",")
	lim := Ceilings{MaxCloseWaitSecs: 3600, MaxListEntries: 1024}
	tests := []struct {
		name    string
		pod, ns map[string]string
		want    string
	}{
		{"close-wait over the ceiling", map[string]string{AnnotationCloseWaitTimeout: "3601"}, nil,
			`annotation config.linkerd.io/close-wait-timeout="3601" on pod web/api-0: 3601s is more than max-close-wait-timeout-secs allows (3600)`},
		{"close-wait duration over the ceiling", map[string]string{AnnotationCloseWaitTimeout: "24h"}, nil,
			`annotation config.linkerd.io/close-wait-timeout="24h" on pod web/api-0: 86400s is more than max-close-wait-timeout-secs allows (3600)`},
		{"close-wait on the namespace", nil, map[string]string{AnnotationCloseWaitTimeout: "2147483"},
			`annotation config.linkerd.io/close-wait-timeout="2147483" on namespace web: 2147483s is more than max-close-wait-timeout-secs allows (3600)`},
		{"subnets over the ceiling", map[string]string{AnnotationSkipSubnets: many}, nil,
			`annotation config.linkerd.io/skip-subnets="(1025 entries)" on pod web/api-0: more entries than max-annotation-list-entries allows (1024)`},
		{"ports on the namespace", nil, map[string]string{AnnotationSkipOutboundPorts: strings.TrimSuffix(strings.Repeat("80,", 1025), ",")},
			`annotation config.linkerd.io/skip-outbound-ports="(1025 entries)" on namespace web: more entries than max-annotation-list-entries allows (1024)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pod := Object{Kind: "pod", Name: "web/api-0", Annotations: tt.pod}
			ns := &Object{Kind: "namespace", Name: "web", Annotations: tt.ns}
			_, err := Merge(baseConfig(), lim, pod, ns, nil)
			if err == nil || err.Error() != "invalid annotation: "+tt.want {
				t.Fatalf("err = %v\nwant invalid annotation: %s", err, tt.want)
			}
		})
	}
	// At the ceilings, accepted.
	atMost := Object{Kind: "pod", Name: "web/api-0", Annotations: map[string]string{
		AnnotationCloseWaitTimeout: "1h", AnnotationSkipSubnets: strings.TrimSuffix(strings.Repeat("192.0.2.1/32,", 1024), ","),
	}}
	if s, err := Merge(baseConfig(), lim, atMost, nil, nil); err != nil || s.Config.CloseWaitSecs != 3600 {
		t.Errorf("at the ceilings: %+v, %v", s.Config.CloseWaitSecs, err)
	}
}

// Numbers that once passed: a UID above 2^32-2 became root's exemption in the nftables rules,
// and close-wait values overflowed (18446744074 s wrapped to 290 ms and wrote 0) or were dropped.
func TestMergeNumericBounds(t *testing.T) {
	tests := []struct{ annotation, value, want string }{
		{AnnotationProxyUID, "4294967296", `annotation config.linkerd.io/proxy-uid="4294967296" on pod web/api-0: must be -1 (none) or a UID from 1 to 4294967294`},
		{AnnotationProxyGID, "4294967295", `annotation config.linkerd.io/proxy-gid="4294967295" on pod web/api-0: must be -1 (none) or a GID from 1 to 4294967294`},
		{AnnotationProxyUID, "99999999999999999999", `annotation config.linkerd.io/proxy-uid="99999999999999999999" on pod web/api-0: not an integer UID`},
		{AnnotationCloseWaitTimeout, "18446744074", `annotation config.linkerd.io/close-wait-timeout="18446744074" on pod web/api-0: must be 0 (leave the kernel's) or 1 to 2147483 seconds, the most every kernel accepts`},
		{AnnotationCloseWaitTimeout, "9999999999", `annotation config.linkerd.io/close-wait-timeout="9999999999" on pod web/api-0: must be 0 (leave the kernel's) or 1 to 2147483 seconds`},
		{AnnotationCloseWaitTimeout, "600h", `annotation config.linkerd.io/close-wait-timeout="600h" on pod web/api-0: "2160000": must be 0 (leave the kernel's) or 1 to 2147483 seconds`},
		{AnnotationCloseWaitTimeout, "999999999h", `annotation config.linkerd.io/close-wait-timeout="999999999h" on pod web/api-0: not a duration such as "1h" or "3600s"`},
		{AnnotationCloseWaitTimeout, "0", `annotation config.linkerd.io/close-wait-timeout="0" on pod web/api-0: must be at least 1s`},
	}
	for _, tt := range tests {
		t.Run(tt.annotation+"="+tt.value, func(t *testing.T) {
			pod := Object{Kind: "pod", Name: "web/api-0", Annotations: map[string]string{tt.annotation: tt.value}}
			_, err := Merge(baseConfig(), kernelBoundsOnly, pod, nil, nil)
			var ae *badinput.Error
			if !errors.As(err, &ae) || len(ae.Problems) != 1 || !strings.HasPrefix(ae.Problems[0].String(), tt.want) {
				t.Fatalf("err = %v\nwant one problem starting %s", err, tt.want)
			}
		})
	}
	// The largest values the kernel and the ID space take are accepted.
	ok := Object{Kind: "pod", Name: "web/api-0", Annotations: map[string]string{AnnotationProxyUID: "4294967294", AnnotationCloseWaitTimeout: "2147483"}}
	if s, err := Merge(baseConfig(), kernelBoundsOnly, ok, nil, nil); err != nil || s.Config.ProxyUID != 4294967294 || s.Config.CloseWaitSecs != 2147483 {
		t.Errorf("Merge = %+v, %v", s.Config, err)
	}
}

func TestMergeMalformed(t *testing.T) {
	pod := Object{Kind: "pod", Name: "web/api-0", Annotations: map[string]string{
		AnnotationSkipOutboundPorts: "80,abc",
		AnnotationSkipInboundPorts:  "9000-8000",
		AnnotationProxyUID:          "0",
		AnnotationInboundPort:       "70000",
		AnnotationCloseWaitTimeout:  "soon",
	}}
	ns := &Object{Kind: "namespace", Name: "web", Annotations: map[string]string{
		AnnotationRerouteVirtualInterfaces: "tap0,eth0/1",
		AnnotationSkipSubnets:              "10.0.0.0/8,nope",
		AnnotationProxyGID:                 "-5",
		AnnotationOutboundPort:             "x",
	}}
	_, err := Merge(baseConfig(), DefaultCeilings, pod, ns, nil)
	var ae *badinput.Error
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v, want *badinput.Error", err)
	}
	want := []string{
		`annotation config.linkerd.io/skip-outbound-ports="80,abc" on pod web/api-0: "abc" is not a port number`,
		`annotation config.linkerd.io/skip-inbound-ports="9000-8000" on pod web/api-0: range 9000-8000 is reversed`,
		`annotation config.linkerd.io/skip-subnets="10.0.0.0/8,nope" on namespace web: "nope" is not a CIDR or an IP address`,
		`annotation config.linkerd.io/proxy-uid="0" on pod web/api-0: refusing to exempt UID 0 (root): use -1 for no exemption`,
		`annotation config.linkerd.io/proxy-gid="-5" on namespace web: must be -1 (none) or a GID from 1 to 4294967294`,
		`annotation config.linkerd.io/inbound-port="70000" on pod web/api-0: port is outside 1-65535`,
		`annotation config.linkerd.io/outbound-port="x" on namespace web: not an integer port`,
		`annotation config.linkerd.io/close-wait-timeout="soon" on pod web/api-0: not a duration such as "1h" or "3600s"`,
		`annotation config.linkerd.io/reroute-virtual-interfaces="tap0,eth0/1" on namespace web: "eth0/1": holds '/', which the kernel refuses in an interface name`,
	}
	if len(ae.Problems) != len(want) {
		t.Fatalf("%d problems, want %d: %v", len(ae.Problems), len(want), err)
	}
	for i, p := range ae.Problems {
		if p.String() != want[i] {
			t.Errorf("problem %d\n got %s\nwant %s", i, p, want[i])
		}
	}
	if !strings.HasPrefix(err.Error(), "invalid annotation: "+want[0]+"; ") {
		t.Errorf("message %q", err.Error())
	}
}

// A virtual machine's interface that the node's config ignores is refused, naming the annotation.
func TestMergeRerouteIgnoredInterface(t *testing.T) {
	base := baseConfig()
	base.InterfacesToIgnore = []string{"net1"}
	pod := Object{Kind: "pod", Name: "web/api-0", Annotations: map[string]string{AnnotationRerouteVirtualInterfaces: "tap0,net1"}}
	_, err := Merge(base, DefaultCeilings, pod, nil, nil)
	want := `invalid annotation: annotation config.linkerd.io/reroute-virtual-interfaces="tap0,net1" on pod web/api-0: "net1": also in interfaces-to-ignore: its traffic cannot both skip the proxy and reach it`
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}

// The subnet annotations are filtered by family like every CIDR: an IPv4 subnet reaches only the
// IPv4 rules. A bad one is named with its annotation, even where two annotations feed the same
// field.
func TestMergeSubnetAnnotations(t *testing.T) {
	base := baseConfig()
	base.IPv6 = true
	pod := Object{Kind: "pod", Name: "web/api-0", Annotations: map[string]string{
		AnnotationSkipOutboundSubnets: "198.51.100.0/24,2001:db8:1::/48",
		AnnotationSkipInboundSubnets:  "2001:db8:2::/48",
	}}
	s, err := Merge(base, DefaultCeilings, pod, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		f           iptables.Family
		want, never string
	}{
		{iptables.IPv4, "-d 198.51.100.0/24", "2001:db8"},
		{iptables.IPv6, "-d 2001:db8:1::/48", "198.51.100.0"},
		{iptables.IPv6, "-s 2001:db8:2::/48", "10.0.0.0"},
	} {
		all := strings.Join(s.Rules.Saved(c.f).Rules, "\n")
		if !strings.Contains(all, c.want) || strings.Contains(all, c.never) {
			t.Errorf("%s rules: want %q and no %q:\n%s", c.f, c.want, c.never, all)
		}
	}
	bad := Object{Kind: "pod", Name: "web/api-0", Annotations: map[string]string{
		AnnotationSkipSubnets:         "192.0.2.0/24",
		AnnotationSkipInboundSubnets:  "203.0.113.0/24,nope",
		AnnotationSkipOutboundSubnets: "198.51.100.0/33",
	}}
	_, err = Merge(base, DefaultCeilings, bad, nil, nil)
	var ae *badinput.Error
	if !errors.As(err, &ae) {
		t.Fatalf("err = %v, want *badinput.Error", err)
	}
	want := []string{
		`annotation config.linkerd.io/skip-inbound-subnets="203.0.113.0/24,nope" on pod web/api-0: "nope" is not a CIDR or an IP address`,
		`annotation config.linkerd.io/skip-outbound-subnets="198.51.100.0/33" on pod web/api-0: `,
	}
	if len(ae.Problems) != len(want) {
		t.Fatalf("problems %v, want %d", ae.Problems, len(want))
	}
	for i, p := range ae.Problems {
		if !strings.HasPrefix(p.String(), want[i]) {
			t.Errorf("problem %d\n got %s\nwant %s...", i, p, want[i])
		}
	}
}

func TestAPIServerPorts(t *testing.T) {
	svc := &Service{Spec: ServiceSpec{Ports: []ServicePort{
		{Port: 443, TargetPort: TargetPort{Number: 6443}},
		{Port: 8443, TargetPort: TargetPort{Name: "https"}},
		{Port: 6443, TargetPort: TargetPort{Number: 443}},
	}}}
	if got, want := APIServerPorts(svc), []string{"443", "6443", "8443"}; !reflect.DeepEqual(got, want) {
		t.Errorf("APIServerPorts = %v, want %v", got, want)
	}
	if got := APIServerPorts(&Service{}); got != nil {
		t.Errorf("no ports: %v", got)
	}
}

func meshedPod(labels, annotations map[string]string) *Pod {
	return &Pod{
		ObjectMeta: ObjectMeta{Name: "api-0", Namespace: "web", Labels: labels, Annotations: annotations},
		Spec:       PodSpec{Containers: containers("app", "linkerd-proxy")},
	}
}

// TestPlanAPIRequests pins how many GETs each kind of pod costs.
func TestPlanAPIRequests(t *testing.T) {
	every := map[string]string{}
	for _, a := range Annotations {
		every[a] = "1"
	}
	every[AnnotationSkipOutboundPorts] = "3306"
	every[AnnotationSkipSubnets] = "192.0.2.0/24"
	every[AnnotationSkipInboundSubnets] = "203.0.113.0/24"
	every[AnnotationSkipOutboundSubnets] = "198.51.100.0/24"
	kubeSvc := &Service{Spec: ServiceSpec{Ports: []ServicePort{{Port: 443, TargetPort: TargetPort{Number: 16443}}}}}
	tests := []struct {
		name         string
		api          *fakeAPI
		wantKind     Kind
		wantRequests []string
		wantOutbound []string
	}{
		{"unmeshed: pod only", &fakeAPI{pod: &Pod{Spec: PodSpec{Containers: containers("app")}}},
			KindUnmeshed, []string{"pod web/api-0"}, nil},
		{"linkerd-init: pod only", &fakeAPI{pod: &Pod{Spec: PodSpec{InitContainers: containers("linkerd-init"), Containers: containers("linkerd-proxy")}}},
			KindLinkerdInit, []string{"pod web/api-0"}, nil},
		{"meshed, every annotation on the pod: pod only", &fakeAPI{pod: meshedPod(nil, every)},
			KindMeshed, []string{"pod web/api-0"}, []string{"3306"}},
		{"meshed: pod and namespace", &fakeAPI{pod: meshedPod(nil, nil), ns: &Namespace{ObjectMeta: ObjectMeta{Name: "web",
			Annotations: map[string]string{AnnotationSkipOutboundPorts: "5432"}}}},
			KindMeshed, []string{"pod web/api-0", "namespace web"}, []string{"5432"}},
		{"control plane: plus default/kubernetes", &fakeAPI{pod: meshedPod(map[string]string{LabelControlPlaneComponent: "destination"}, every)},
			KindMeshed, []string{"pod web/api-0", "service default/kubernetes"}, []string{"3306", "443", "6443"}},
		{"control plane with the Service", &fakeAPI{pod: meshedPod(map[string]string{LabelControlPlaneComponent: "destination"}, every), svc: kubeSvc},
			KindMeshed, []string{"pod web/api-0", "service default/kubernetes"}, []string{"3306", "443", "16443"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conf, err := ParseConfig(withVersion(t, linkerdChartConfig, "1.0.0"))
			if err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			p := &Plugin{Stderr: &logs, NewPodAPI: func(*NetConf) (PodAPI, error) { return tt.api, nil }}
			c, _ := p.start("ADD", &skel.CmdArgs{Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0"}, conf)
			pl, err := p.podRules(c)
			if err != nil {
				t.Fatal(err)
			}
			if pl.kind != tt.wantKind {
				t.Errorf("kind %s, want %s", pl.kind, tt.wantKind)
			}
			if !reflect.DeepEqual(tt.api.requests, tt.wantRequests) || pl.requests != len(tt.wantRequests) {
				t.Errorf("requests %v (counted %d), want %v", tt.api.requests, pl.requests, tt.wantRequests)
			}
			if tt.wantOutbound != nil && !reflect.DeepEqual(pl.settings.Config.OutboundPortsToIgnore, tt.wantOutbound) {
				t.Errorf("outbound ports to ignore %v, want %v", pl.settings.Config.OutboundPortsToIgnore, tt.wantOutbound)
			}
		})
	}
}

func TestAddFailures(t *testing.T) {
	tests := []struct {
		name     string
		api      *fakeAPI
		wantCode uint
		wantMsg  string
	}{
		{"malformed pod annotation", &fakeAPI{pod: meshedPod(nil, map[string]string{AnnotationSkipOutboundPorts: "80,http"}), ns: &Namespace{}},
			types.ErrInvalidNetworkConfig,
			`invalid annotation: annotation config.linkerd.io/skip-outbound-ports="80,http" on pod web/api-0: "http" is not a port number`},
		{"namespace unreadable", &fakeAPI{pod: meshedPod(nil, nil), err: errors.New("forbidden")},
			types.ErrTryAgainLater,
			`meshed pod web/api-0: its namespace's annotations cannot be read (timeout 10s): forbidden`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, logs bytes.Buffer
			p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: func(*NetConf) (PodAPI, error) { return tt.api, nil }}
			err := p.Add(&skel.CmdArgs{ContainerID: "c", Netns: "/nonexistent", Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0",
				StdinData: withVersion(t, linkerdChartConfig, "1.0.0")})
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != tt.wantCode || ce.Msg != tt.wantMsg {
				t.Fatalf("err = %#v\nwant code %d, %q", err, tt.wantCode, tt.wantMsg)
			}
			if out.Len() != 0 {
				t.Errorf("stdout %q", out.String())
			}
		})
	}
}

// TestAddSimulate runs a meshed pod with simulate on: the rules are logged, nothing is written
// (the netns does not even exist) and prevResult passes through.
func TestAddSimulate(t *testing.T) {
	api := &fakeAPI{pod: meshedPod(nil, nil), ns: &Namespace{}}
	var out, logs bytes.Buffer
	p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: func(*NetConf) (PodAPI, error) { return api, nil }}
	conf := strings.Replace(linkerdChartConfig, `"simulate":false`, `"simulate":true`, 1)
	if err := p.Add(&skel.CmdArgs{ContainerID: "c", Netns: "/nonexistent", Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0",
		StdinData: withVersion(t, conf, "0.4.0")}); err != nil {
		t.Fatal(err)
	}
	jsonEqual(t, out.String(), prevResults["0.4.0"])
	if !strings.Contains(logs.String(), "redirect-all-outgoing-to-proxy-port") {
		t.Errorf("simulate did not log the rules: %s", logs.String())
	}
}

func TestDelNeverFails(t *testing.T) {
	tests := []struct{ name, netns, config string }{
		{"garbage config", "/nonexistent", `garbage`},
		{"netns gone", "/nonexistent/netns", linkerdChartConfig},
		{"no netns", "", linkerdChartConfig},
		{"invalid values", "/nonexistent", `{"cniVersion":"1.0.0","linkerd":{"proxy-uid":"x"}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, logs bytes.Buffer
			p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: noAPI(t)}
			if err := p.Del(&skel.CmdArgs{ContainerID: "c", Netns: tt.netns, Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0", StdinData: []byte(tt.config)}); err != nil {
				t.Errorf("DEL failed: %v", err)
			}
			if out.Len() != 0 {
				t.Errorf("DEL wrote %q to stdout", out.String())
			}
		})
	}
}

func TestMain_Subcommands(t *testing.T) {
	tests := []struct {
		args     []string
		code     int
		contains string
	}{
		{[]string{"version"}, 0, "linkerd-cni dev"},
		{[]string{"help"}, 0, "install   install the plugin on this node"},
		{[]string{"frobnicate"}, 2, `unknown command "frobnicate"`},
		{nil, 2, "usage: linkerd-cni"},
	}
	for _, tt := range tests {
		var out, errOut bytes.Buffer
		code := Main(tt.args, &out, &errOut)
		if code != tt.code || !strings.Contains(out.String()+errOut.String(), tt.contains) {
			t.Errorf("Main(%v) = %d, %q %q; want %d containing %q", tt.args, code, out.String(), errOut.String(), tt.code, tt.contains)
		}
	}
}

// TestAddRefusesEmptyNetns: a meshed pod without CNI_NETNS must fail, never fall back to the
// current namespace (the node's).
func TestAddRefusesEmptyNetns(t *testing.T) {
	api := &fakeAPI{pod: meshedPod(nil, nil), ns: &Namespace{}}
	var out, logs bytes.Buffer
	p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: func(*NetConf) (PodAPI, error) { return api, nil }}
	args := &skel.CmdArgs{ContainerID: "c", Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0", StdinData: withVersion(t, linkerdChartConfig, "1.0.0")}
	for name, cmd := range map[string]func(*skel.CmdArgs) error{"ADD": p.Add, "CHECK": p.Check} {
		err := cmd(args)
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != types.ErrInvalidEnvironmentVariables || !strings.Contains(ce.Msg, "CNI_NETNS is empty") {
			t.Errorf("%s without a netns: %v", name, err)
		}
	}
	if out.Len() != 0 {
		t.Errorf("stdout %q", out.String())
	}
}

// TestObjectsDecodeCoreV1JSON shows that the plugin's small types read the same fields out of
// the API's JSON as k8s.io/api/core/v1 would, for every field the plugin uses.
func TestObjectsDecodeCoreV1JSON(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	labels := map[string]string{LabelControlPlaneComponent: "destination"}
	annotations := map[string]string{AnnotationSkipOutboundPorts: "3306"}
	roundTrip := func(from, into any) {
		t.Helper()
		raw, err := json.Marshal(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, into); err != nil {
			t.Fatalf("decode %s: %v", raw, err)
		}
	}

	var pod Pod
	roundTrip(&corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "shop", Labels: labels, Annotations: annotations},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: ProxyContainerName, Image: "proxy", RestartPolicy: &always}},
			Containers:     []corev1.Container{{Name: "app", Image: "app", Ports: []corev1.ContainerPort{{ContainerPort: 8080}}}},
		},
	}, &pod)
	want := Pod{
		ObjectMeta: ObjectMeta{Name: "web-0", Namespace: "shop", Labels: labels, Annotations: annotations},
		Spec: PodSpec{
			InitContainers: []Container{{Name: ProxyContainerName, RestartPolicy: RestartPolicyAlways}},
			Containers:     []Container{{Name: "app"}},
		},
	}
	if !reflect.DeepEqual(pod, want) {
		t.Errorf("pod decoded as %+v, want %+v", pod, want)
	}
	if got := Classify(&pod.Spec); got != KindNativeSidecar {
		t.Errorf("decoded pod classified %s, want %s", got, KindNativeSidecar)
	}

	var ns Namespace
	roundTrip(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "shop", Annotations: annotations}}, &ns)
	if ns.Name != "shop" || !reflect.DeepEqual(ns.Annotations, annotations) {
		t.Errorf("namespace decoded as %+v", ns)
	}

	var svc Service
	roundTrip(&corev1.Service{Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
		{Name: "https", Port: 443, TargetPort: intstr.FromInt32(6443)},
		{Name: "alt", Port: 8443, TargetPort: intstr.FromString("https")},
		{Name: "none", Port: 9443},
	}}}, &svc)
	wantPorts := []ServicePort{{443, TargetPort{Number: 6443}}, {8443, TargetPort{Name: "https"}}, {9443, TargetPort{}}}
	if !reflect.DeepEqual(svc.Spec.Ports, wantPorts) {
		t.Errorf("service ports decoded as %+v, want %+v", svc.Spec.Ports, wantPorts)
	}
	if got, want := APIServerPorts(&svc), []string{"443", "6443", "8443", "9443"}; !reflect.DeepEqual(got, want) {
		t.Errorf("decoded service gives ports %v, want %v", got, want)
	}
	// A targetPort that is neither a number nor a name is refused, as apimachinery refuses it.
	for _, bad := range []string{`{"port":443,"targetPort":true}`, `{"port":443,"targetPort":1.5}`} {
		var p ServicePort
		var ip corev1.ServicePort
		ours, theirs := json.Unmarshal([]byte(bad), &p), json.Unmarshal([]byte(bad), &ip)
		if (ours == nil) != (theirs == nil) || ours == nil {
			t.Errorf("%s: ours %v, apimachinery's %v; want both to refuse it", bad, ours, theirs)
		}
	}
}
