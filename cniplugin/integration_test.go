package cniplugin_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/kubetest"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// TestCNI runs every scenario against one node (one kube-apiserver start). The last subtest stops
// the API server.
func TestCNI(t *testing.T) {
	n := newNode(t, true)
	srv := netnstest.StartServer(t, n.ns, ":18080")

	t.Run("meshed lifecycle", func(t *testing.T) {
		for _, mode := range []iptables.Mode{iptables.ModeNFTables, iptables.ModeNFT, ""} {
			name := string(mode)
			if name == "" {
				name = "default-legacy"
			}
			t.Run(name, func(t *testing.T) { testMeshedLifecycle(t, n, srv, mode) })
		}
	})
	t.Run("user namespace pod", func(t *testing.T) {
		for _, mode := range []iptables.Mode{iptables.ModeNFT, "", iptables.ModeAuto} {
			name := string(mode)
			if name == "" {
				name = "default-legacy"
			}
			t.Run(name, func(t *testing.T) { testUserNamespacePod(t, n, srv, mode) })
		}
	})
	t.Run("alone, as a NetworkAttachmentDefinition", func(t *testing.T) {
		for _, ver := range []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
			t.Run(ver, func(t *testing.T) { testAlone(t, n, ver) })
		}
	})
	t.Run("native sidecar", func(t *testing.T) { testNativeSidecar(t, n) })
	t.Run("left alone", func(t *testing.T) { testLeftAlone(t, n) })
	t.Run("annotations", func(t *testing.T) { testAnnotations(t, n) })
	t.Run("control plane", func(t *testing.T) { testControlPlane(t, n) })
	t.Run("exclude-namespaces", func(t *testing.T) { testExcludeNamespaces(t, n) })
	t.Run("pod not in the API", func(t *testing.T) { testMissingPod(t, n) })
	t.Run("credentials", func(t *testing.T) { testCredentials(t, n) })
	t.Run("hung API", func(t *testing.T) { testHungAPI(t, n) })
	t.Run("STATUS", func(t *testing.T) { testStatus(t, n) })
	t.Run("50 concurrent ADDs", func(t *testing.T) { testConcurrentAdds(t, n, 50) })
	t.Run("log lines", func(t *testing.T) { testLogLines(t, n) })
	t.Run("API gone", func(t *testing.T) { testAPIGone(t, n) })
}

// testMeshedLifecycle: a classic meshed pod gets exactly the expected rules; real TCP is
// redirected both ways with the original destination preserved and the proxy's UID exempt; the
// pod cost two API requests; CHECK passes, then fails naming a rule deleted by hand; DEL removes
// everything, and DEL succeeds again once the netns is gone.
func testMeshedLifecycle(t *testing.T, n *node, srv *netnstest.Server, mode iptables.Mode) {
	ns := "meshed-" + string(mode)
	if mode == "" {
		ns = "meshed-legacy"
	}
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	list := n.conflist(t, netOpts{mode: mode})
	sb := n.newSandbox(t, ns, "web")
	res := n.mustAdd(t, list, sb)
	if !sb.podIP.IsValid() {
		t.Fatalf("no IPv4 address in the result: %v", res)
	}
	expectRules(t, sb, baseConfig(mode))

	proxy := netnstest.StartProxy(t, sb.ns, 4140, 4143)
	// Outbound from the app is redirected to the proxy's outbound port.
	target := netnstest.HostPort(gatewayIP, 18080)
	reply, err := netnstest.Dial(t, sb.ns, "tcp4", target, netnstest.DialOpts{UID: 1000})
	if err != nil || reply != "proxy 4140" {
		t.Fatalf("app -> %s: reply %q, %v; want the proxy's outbound port", target, reply, err)
	}
	if c := proxy.Expect(t, 2*time.Second); c.OriginalDst != netnstest.AddrPort(gatewayIP, 18080) {
		t.Errorf("outbound original destination %s, want %s", c.OriginalDst, target)
	}
	// The proxy's own traffic (UID 2102) goes out untouched.
	reply, err = netnstest.Dial(t, sb.ns, "tcp4", target, netnstest.DialOpts{UID: 2102})
	if err != nil || !strings.HasPrefix(reply, "server") {
		t.Fatalf("proxy uid -> %s: reply %q, %v; want the real server", target, reply, err)
	}
	srv.Expect(t, 2*time.Second)
	// Inbound to any port lands on the proxy's inbound port.
	podAddr := netnstest.HostPort(sb.podIP.String(), 8080)
	reply, err = netnstest.Dial(t, n.ns, "tcp4", podAddr, netnstest.DialOpts{})
	if err != nil || reply != "proxy 4143" {
		t.Fatalf("node -> pod %s: reply %q, %v; want the proxy's inbound port", podAddr, reply, err)
	}
	if c := proxy.Expect(t, 2*time.Second); c.OriginalDst != netnstest.AddrPort(sb.podIP.String(), 8080) {
		t.Errorf("inbound original destination %s, want %s", c.OriginalDst, podAddr)
	}
	// Skipped inbound ports reach the app directly.
	app := netnstest.StartServer(t, sb.ns, ":4191")
	if reply, err := netnstest.Dial(t, n.ns, "tcp4", netnstest.HostPort(sb.podIP.String(), 4191), netnstest.DialOpts{}); err != nil || !strings.HasPrefix(reply, "server") {
		t.Errorf("node -> pod:4191 (ignored port): reply %q, %v; want the app", reply, err)
	}
	app.Expect(t, 2*time.Second)

	if evs := n.waitAPIEvents(t, ns, 2); len(evs) != 2 {
		t.Errorf("a meshed pod cost %d API requests, want 2 (pod, namespace): %v", len(evs), eventURIs(evs))
	} else {
		for _, uri := range eventURIs(evs) {
			if !strings.Contains(uri, "resourceVersion=0") {
				t.Errorf("%s: not served from the watch cache (resourceVersion=0)", uri)
			}
		}
	}

	if err := n.check(list, sb); err != nil {
		t.Fatalf("CHECK on fresh rules: %v", err)
	}
	deleteFirstOutputRule(t, sb, mode)
	err = n.check(list, sb)
	if err == nil {
		t.Fatal("CHECK passed after a rule was deleted by hand")
	}
	if !strings.Contains(err.Error(), "missing") || !strings.Contains(err.Error(), "2102") {
		t.Errorf("CHECK error does not name the missing UID rule: %v", err)
	}

	if err := n.del(list, sb); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	expectNoRules(t, sb)
	sb.remove(t)
	if err := n.del(list, sb); err != nil {
		t.Errorf("DEL with the netns gone: %v", err)
	}
}

// testAlone: linkerd-cni alone in a conflist, as Multus runs a NetworkAttachmentDefinition
// holding only it (the pod's k8s.v1.cni.cncf.io/networks annotation names it), after the pod's
// default network and on the interface name Multus gives it (net1). There is no prevResult: ADD
// writes the same rules as in a chain and returns an empty result of the config's CNI version,
// CHECK passes, DEL removes the rules and leaves the default network alone.
func testAlone(t *testing.T, n *node, ver string) {
	ns := "alone-" + strings.ReplaceAll(ver, ".", "-")
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	sb := n.newSandbox(t, ns, "web")
	defaultNet := n.conflist(t, netOpts{bridgeOnly: true})
	n.mustAdd(t, defaultNet, sb)
	nad := n.conflist(t, netOpts{mode: iptables.ModeNFT, alone: true, cniVersion: ver})
	rt := *sb.rt
	rt.IfName = "net1"
	var res types.Result
	if err := n.inNode(func(ctx context.Context) (err error) {
		res, err = n.cni.AddNetworkList(ctx, nad, &rt)
		return err
	}); err != nil {
		t.Fatalf("ADD of linkerd-cni alone: %v\n%s", err, n.logTail(rt.ContainerID))
	}
	if res.Version() != ver {
		t.Errorf("result version %s, want the config's %s", res.Version(), ver)
	}
	if r, err := current.NewResultFromResult(res); err != nil || len(r.IPs) != 0 || len(r.Interfaces) != 0 {
		t.Errorf("result %+v (%v), want an empty one: the plugin created nothing", res, err)
	}
	expectRules(t, sb, baseConfig(iptables.ModeNFT))
	proxy := netnstest.StartProxy(t, sb.ns, 4140, 4143)
	target := netnstest.HostPort(gatewayIP, 18080)
	if reply, err := netnstest.Dial(t, sb.ns, "tcp4", target, netnstest.DialOpts{UID: 1000}); err != nil || reply != "proxy 4140" {
		t.Fatalf("app -> %s: reply %q, %v; want the proxy's outbound port", target, reply, err)
	}
	proxy.Expect(t, 2*time.Second)
	if ver != "0.3.1" { // CHECK came with 0.4.0
		if err := n.inNode(func(ctx context.Context) error { return n.cni.CheckNetworkList(ctx, nad, &rt) }); err != nil {
			t.Errorf("CHECK: %v", err)
		}
	}
	if err := n.inNode(func(ctx context.Context) error { return n.cni.DelNetworkList(ctx, nad, &rt) }); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	expectNoRules(t, sb)
	if err := n.del(defaultNet, sb); err != nil {
		t.Errorf("DEL of the default network: %v", err)
	}
}

// testUserNamespacePod: a meshed pod with hostUsers: false, whose network namespace belongs to a
// user namespace of its own (root there is host UID netnstest.UserNSHostRoot). In every mode (nft,
// Linkerd's chart default, legacy and auto) the plugin writes the native nftables table, since
// the kernel refuses iptables' owner match there from outside that user namespace, and says so at
// each operation's backend choice: ADD redirects, the proxy's UID inside the pod is exempt, CHECK
// passes and DEL removes everything.
func testUserNamespacePod(t *testing.T, n *node, srv *netnstest.Server, mode iptables.Mode) {
	ns := "userns-" + string(mode)
	if mode == "" {
		ns = "userns-legacy"
	}
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	list := n.conflist(t, netOpts{mode: mode})
	sb := n.newUserNSSandbox(t, ns, "web")
	n.mustAdd(t, list, sb)
	want := baseConfig(mode)
	want.Mode = iptables.ModeNFTables
	expectRules(t, sb, want)
	if out, _ := netnstest.RunIn(t, sb.ns, "iptables-nft-save", "-t", "nat"); strings.Contains(out, "PROXY_INIT") {
		t.Errorf("iptables-nft holds rules of ours besides the native table:\n%s", out)
	}

	proxy := netnstest.StartProxy(t, sb.ns, 4140, 4143)
	target := netnstest.HostPort(gatewayIP, 18080)
	inPod := func(uid int) int { return netnstest.UserNSHostRoot + uid }
	if reply, err := netnstest.Dial(t, sb.ns, "tcp4", target, netnstest.DialOpts{UID: inPod(1000)}); err != nil || reply != "proxy 4140" {
		t.Fatalf("app -> %s: reply %q, %v; want the proxy's outbound port", target, reply, err)
	}
	proxy.Expect(t, 2*time.Second)
	if reply, err := netnstest.Dial(t, sb.ns, "tcp4", target, netnstest.DialOpts{UID: inPod(2102)}); err != nil || !strings.HasPrefix(reply, "server") {
		t.Fatalf("proxy (uid 2102 in the pod) -> %s: reply %q, %v; want the real server", target, reply, err)
	}
	srv.Expect(t, 2*time.Second)
	if err := n.check(list, sb); err != nil {
		t.Fatalf("CHECK: %v\n%s", err, n.logTail(sb.rt.ContainerID))
	}
	if err := n.del(list, sb); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	expectNoRules(t, sb)
	log := n.logTail(sb.rt.ContainerID)
	const why = "(a pod with hostUsers: false): iptables' owner match is refused there from outside it; writing the native nftables table instead"
	var choices int
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, `msg="backend chosen"`) {
			choices++
			if !strings.Contains(l, "backend=nftables") || !strings.Contains(l, why) || !strings.Contains(l, "userns=user:[") {
				t.Errorf("a backend choice that is not the native table for the pod's user namespace: %s", l)
			}
		}
	}
	if choices < 3 {
		t.Errorf("%d backend choices logged, want one for each of ADD, CHECK and DEL:\n%s", choices, log)
	}
}

// deleteFirstOutputRule deletes the first rule of PROXY_INIT_OUTPUT (the proxy UID exemption) with
// the tools an operator would use.
func deleteFirstOutputRule(t *testing.T, sb *sandbox, mode iptables.Mode) {
	t.Helper()
	run := func(name string, args ...string) string {
		out, err := netnstest.RunIn(t, sb.ns, name, args...)
		if err != nil {
			t.Fatalf("%s %v: %v", name, args, err)
		}
		return out
	}
	switch mode {
	case iptables.ModeNFTables:
		out := run("nft", "-a", "list", "chain", "inet", iptables.NFTTableName, iptables.OutputChain)
		re := regexp.MustCompile(`(?m)^\s+\S.*skuid.*# handle (\d+)$`)
		m := re.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no UID rule in:\n%s", out)
		}
		run("nft", "delete", "rule", "inet", iptables.NFTTableName, iptables.OutputChain, "handle", m[1])
	case iptables.ModeNFT:
		run("iptables-nft", "-t", "nat", "-D", iptables.OutputChain, "1")
	default:
		run("iptables-legacy", "-t", "nat", "-D", iptables.OutputChain, "1")
	}
}

func eventURIs(evs []kubetest.AuditEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Verb+" "+e.RequestURI)
	}
	return out
}

// testNativeSidecar: linkerd-proxy as a native sidecar init container gets the same rules and
// redirect.
func testNativeSidecar(t *testing.T, n *node) {
	ns := "native"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeNative, nil, nil)
	list := n.conflist(t, netOpts{mode: iptables.ModeNFTables})
	sb := n.newSandbox(t, ns, "web")
	n.mustAdd(t, list, sb)
	expectRules(t, sb, baseConfig(iptables.ModeNFTables))
	proxy := netnstest.StartProxy(t, sb.ns, 4140, 4143)
	target := netnstest.HostPort("198.51.100.7", 443)
	if reply, err := netnstest.Dial(t, sb.ns, "tcp4", target, netnstest.DialOpts{UID: 1000}); err != nil || reply != "proxy 4140" {
		t.Fatalf("app -> %s: reply %q, %v; want the proxy", target, reply, err)
	}
	if c := proxy.Expect(t, 2*time.Second); c.OriginalDst != netnstest.AddrPort("198.51.100.7", 443) {
		t.Errorf("original destination %s, want %s", c.OriginalDst, target)
	}
	if err := n.check(list, sb); err != nil {
		t.Errorf("CHECK: %v", err)
	}
}

// testLeftAlone: an unmeshed pod and a pod with linkerd-init get no rules at all, and CHECK
// passes for both.
func testLeftAlone(t *testing.T, n *node) {
	ns := "alone"
	n.createNamespace(t, ns, map[string]string{cniplugin.AnnotationSkipOutboundPorts: "3306"})
	list := n.conflist(t, netOpts{mode: iptables.ModeNFTables})
	for _, shape := range []podShape{shapeUnmeshed, shapeLinkerdInit} {
		t.Run(string(shape), func(t *testing.T) {
			name := "pod-" + string(shape)
			n.createPod(t, ns, name, shape, nil, nil)
			sb := n.newSandbox(t, ns, name)
			n.expectPassThrough(t, list, sb)
		})
	}
	// Neither needed its namespace: one pod GET each.
	if evs := n.waitAPIEvents(t, ns, 4); len(evs) != 4 {
		t.Errorf("%d API requests for two unmeshed pods (ADD and CHECK each), want 4: %v", len(evs), eventURIs(evs))
	}
}

// testAnnotations: each annotation takes effect when set on the pod, and when inherited from the
// pod's namespace.
func testAnnotations(t *testing.T, n *node) {
	const mode = iptables.ModeNFTables
	tests := []struct {
		name, annotation, value string
		edit                    func(c *iptables.Config)
		closeWait               string
	}{
		{"skip-outbound-ports", cniplugin.AnnotationSkipOutboundPorts, "3306,5432-5440",
			func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"3306", "5432-5440"} }, ""},
		{"skip-inbound-ports", cniplugin.AnnotationSkipInboundPorts, "9090",
			func(c *iptables.Config) { c.InboundPortsToIgnore = append(c.InboundPortsToIgnore, "9090") }, ""},
		{"skip-subnets", cniplugin.AnnotationSkipSubnets, "192.0.2.0/24,2001:db8:1::/48",
			func(c *iptables.Config) { c.InboundSubnetsToIgnore = []string{"192.0.2.0/24", "2001:db8:1::/48"} }, ""},
		{"skip-inbound-subnets", cniplugin.AnnotationSkipInboundSubnets, "192.0.2.0/24,2001:db8:1::/48",
			func(c *iptables.Config) { c.InboundSubnetsToIgnore = []string{"192.0.2.0/24", "2001:db8:1::/48"} }, ""},
		{"skip-outbound-subnets", cniplugin.AnnotationSkipOutboundSubnets, "198.51.100.0/24,2001:db8:2::/48",
			func(c *iptables.Config) { c.OutboundSubnetsToIgnore = []string{"198.51.100.0/24", "2001:db8:2::/48"} }, ""},
		{"proxy-uid", cniplugin.AnnotationProxyUID, "3000", func(c *iptables.Config) { c.ProxyUID = 3000 }, ""},
		{"proxy-gid", cniplugin.AnnotationProxyGID, "3001", func(c *iptables.Config) { c.ProxyGID = 3001 }, ""},
		{"inbound-port", cniplugin.AnnotationInboundPort, "5143", func(c *iptables.Config) { c.InboundProxyPort = 5143 }, ""},
		{"outbound-port", cniplugin.AnnotationOutboundPort, "5140", func(c *iptables.Config) { c.OutboundProxyPort = 5140 }, ""},
		{"close-wait-timeout", cniplugin.AnnotationCloseWaitTimeout, "77s", func(*iptables.Config) {}, "77"},
	}
	list := n.conflist(t, netOpts{mode: mode})
	for _, tt := range tests {
		for _, on := range []string{"pod", "namespace"} {
			t.Run(tt.name+" on "+on, func(t *testing.T) {
				ns := "ann-" + tt.name + "-" + on
				var nsAnn, podAnn map[string]string
				if on == "pod" {
					podAnn = map[string]string{tt.annotation: tt.value}
					// The namespace says otherwise: the pod wins.
					nsAnn = map[string]string{tt.annotation: "1"}
					switch tt.annotation {
					case cniplugin.AnnotationSkipSubnets, cniplugin.AnnotationSkipInboundSubnets, cniplugin.AnnotationSkipOutboundSubnets:
						nsAnn[tt.annotation] = "203.0.113.0/24"
					}
				} else {
					nsAnn = map[string]string{tt.annotation: tt.value}
				}
				n.createNamespace(t, ns, nsAnn)
				n.createPod(t, ns, "web", shapeClassic, nil, podAnn)
				sb := n.newSandbox(t, ns, "web")
				n.mustAdd(t, list, sb)
				want := baseConfig(mode)
				tt.edit(&want)
				expectRules(t, sb, want)
				if tt.closeWait != "" {
					if got := readSysctl(t, sb, "/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait"); got != tt.closeWait {
						t.Errorf("close-wait timeout %s, want %s", got, tt.closeWait)
					}
				}
				if err := n.check(list, sb); err != nil {
					t.Errorf("CHECK: %v", err)
				}
			})
		}
	}
	t.Run("real redirect to the annotated outbound port", func(t *testing.T) {
		ns := "ann-traffic"
		n.createNamespace(t, ns, map[string]string{cniplugin.AnnotationOutboundPort: "5140", cniplugin.AnnotationSkipOutboundPorts: "3306"})
		n.createPod(t, ns, "web", shapeClassic, nil, nil)
		sb := n.newSandbox(t, ns, "web")
		n.mustAdd(t, list, sb)
		proxy := netnstest.StartProxy(t, sb.ns, 5140)
		if reply, err := netnstest.Dial(t, sb.ns, "tcp4", netnstest.HostPort(gatewayIP, 18080), netnstest.DialOpts{UID: 1000}); err != nil || reply != "proxy 5140" {
			t.Fatalf("reply %q, %v; want the proxy on the annotated port 5140", reply, err)
		}
		proxy.Expect(t, 2*time.Second)
		// 3306 is skipped: nothing listens there on the gateway, so the dial is refused rather
		// than answered by the proxy.
		if reply, err := netnstest.Dial(t, sb.ns, "tcp4", netnstest.HostPort(gatewayIP, 3306), netnstest.DialOpts{UID: 1000}); err == nil {
			t.Errorf("dial to skipped port 3306 answered %q; want it to bypass the proxy", reply)
		}
	})
	t.Run("real skip of an annotated outbound subnet", func(t *testing.T) {
		ns := "ann-subnet-traffic"
		n.createNamespace(t, ns, map[string]string{cniplugin.AnnotationSkipOutboundSubnets: podSubnet})
		n.createPod(t, ns, "web", shapeClassic, nil, nil)
		sb := n.newSandbox(t, ns, "web")
		n.mustAdd(t, list, sb)
		netnstest.StartProxy(t, sb.ns, 4140)
		if reply, err := netnstest.Dial(t, sb.ns, "tcp4", netnstest.HostPort(gatewayIP, 18080), netnstest.DialOpts{UID: 1000}); err != nil || !strings.HasPrefix(reply, "server") {
			t.Fatalf("reply %q, %v; want the node's server directly: %s is skipped", reply, err, podSubnet)
		}
	})
	t.Run("malformed annotation fails ADD", func(t *testing.T) {
		ns := "ann-bad"
		n.createNamespace(t, ns, map[string]string{cniplugin.AnnotationSkipSubnets: "10.0.0.0/8,bogus"})
		n.createPod(t, ns, "web", shapeClassic, nil, map[string]string{cniplugin.AnnotationProxyUID: "root"})
		sb := n.newSandbox(t, ns, "web")
		_, err := n.add(t, list, sb)
		if err == nil {
			t.Fatal("ADD succeeded with malformed annotations")
		}
		for _, want := range []string{
			`annotation config.linkerd.io/skip-subnets="10.0.0.0/8,bogus" on namespace ann-bad: "bogus" is not a CIDR or an IP address`,
			`annotation config.linkerd.io/proxy-uid="root" on pod ann-bad/web: not an integer UID`,
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("ADD error %q lacks %q", err, want)
			}
		}
		expectUntouched(t, sb)
	})
}

// testControlPlane: control-plane pods also skip the ports and targetPorts of default/kubernetes.
func testControlPlane(t *testing.T, n *node) {
	ns := "cp"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "destination", shapeClassic, map[string]string{cniplugin.LabelControlPlaneComponent: "destination"}, nil)
	svc, err := n.kube.Clientset.CoreV1().Services("default").Get(context.Background(), "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := baseConfig(iptables.ModeNFTables)
	for _, p := range svc.Spec.Ports {
		want.OutboundPortsToIgnore = append(want.OutboundPortsToIgnore, strconv.Itoa(int(p.Port)), strconv.Itoa(int(p.TargetPort.IntVal)))
	}
	if len(want.OutboundPortsToIgnore) < 2 || want.OutboundPortsToIgnore[0] != "443" {
		t.Fatalf("unexpected default/kubernetes ports %v", want.OutboundPortsToIgnore)
	}
	list := n.conflist(t, netOpts{mode: iptables.ModeNFTables})
	sb := n.newSandbox(t, ns, "destination")
	n.mustAdd(t, list, sb)
	expectRules(t, sb, want)
}

// testExcludeNamespaces: a meshed pod in an excluded namespace passes with no rules and not a
// single API request, counted at the API server's audit log.
func testExcludeNamespaces(t *testing.T, n *node) {
	ns := "excluded"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	list := n.conflist(t, netOpts{mode: iptables.ModeNFTables, top: map[string]any{"exclude-namespaces": []string{"linkerd-cni", ns}}})
	sb := n.newSandbox(t, ns, "web")
	n.expectPassThrough(t, list, sb)
	// A sentinel pod after it: once its requests are in the audit log, the excluded pod's would
	// be too.
	sentinelNS := "excluded-sentinel"
	n.createNamespace(t, sentinelNS, nil)
	n.createPod(t, sentinelNS, "web", shapeUnmeshed, nil, nil)
	sentinel := n.newSandbox(t, sentinelNS, "web")
	n.mustAdd(t, list, sentinel)
	if evs := n.waitAPIEvents(t, sentinelNS, 1); len(evs) != 1 {
		t.Fatalf("sentinel made %d requests, want 1", len(evs))
	}
	if evs := n.apiEvents(t, ns); len(evs) != 0 {
		t.Errorf("excluded namespace cost %d API requests, want 0: %v", len(evs), eventURIs(evs))
	}
	if log := n.logTail(sb.rt.ContainerID); !strings.Contains(log, "exclude-namespaces") {
		t.Errorf("no log line says the pod was excluded:\n%s", log)
	}
}

// testMissingPod: a pod the watch cache does not know is read again from etcd before ADD fails,
// and the failure says the pod was not found.
func testMissingPod(t *testing.T, n *node) {
	ns := "missing"
	n.createNamespace(t, ns, nil)
	sb := n.newSandbox(t, ns, "ghost")
	_, err := n.add(t, n.conflist(t, netOpts{mode: iptables.ModeNFTables}), sb)
	if err == nil || !strings.Contains(err.Error(), "get pod missing/ghost: not found") {
		t.Fatalf("ADD of a pod the API does not have: %v; want a not-found failure", err)
	}
	evs := n.waitAPIEvents(t, ns, 2)
	uris := eventURIs(evs)
	if len(uris) != 2 || !strings.Contains(uris[0], "resourceVersion=0") || strings.Contains(uris[1], "resourceVersion") {
		t.Errorf("requests %v, want a cached GET then one from etcd", uris)
	}
	expectUntouched(t, sb)
}

// testCredentials: an invalid token and a revoked one (its service account deleted) fail ADD
// with a message that says unauthorized and names the kubeconfig.
func testCredentials(t *testing.T, n *node) {
	ns := "creds"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)

	invalid := n.dir + "/invalid-kubeconfig"
	if err := n.kube.WriteKubeconfig(invalid, "not-a-valid-token"); err != nil {
		t.Fatal(err)
	}
	revoked := n.dir + "/revoked-kubeconfig"
	token := n.serviceAccountToken(t, "revoked")
	if err := n.kube.WriteKubeconfig(revoked, token); err != nil {
		t.Fatal(err)
	}
	if err := n.kube.Clientset.CoreV1().ServiceAccounts(cniNamespace).Delete(context.Background(), "revoked", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	for name, kc := range map[string]string{"invalid token": invalid, "revoked token": revoked} {
		t.Run(name, func(t *testing.T) {
			list := n.conflist(t, netOpts{mode: iptables.ModeNFTables, kubernetes: map[string]any{"kubeconfig": kc}})
			sb := n.newSandbox(t, ns, "web")
			_, err := n.add(t, list, sb)
			if err == nil {
				t.Fatal("ADD succeeded with a bad token")
			}
			if !strings.Contains(err.Error(), "unauthorized") || !strings.Contains(err.Error(), kc) {
				t.Errorf("error does not say unauthorized and name %s: %v", kc, err)
			}
			expectUntouched(t, sb)
		})
	}
}

// testHungAPI: an API server that accepts connections and never answers makes ADD fail once the
// configured timeout is over, saying so. kubernetes.k8s_api_root points the plugin at it.
func testHungAPI(t *testing.T, n *node) {
	var ln net.Listener
	if err := n.ns.Do(func() error {
		var err error
		ln, err = net.Listen("tcp4", "127.0.0.1:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	ns := "hung"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	list := n.conflist(t, netOpts{mode: iptables.ModeNFTables,
		kubernetes: map[string]any{"k8s_api_root": "https://" + ln.Addr().String(), "timeout": "2s"}})
	sb := n.newSandbox(t, ns, "web")
	start := time.Now()
	_, err := n.add(t, list, sb)
	took := time.Since(start)
	if err == nil {
		t.Fatal("ADD succeeded against a hung API server")
	}
	if !strings.Contains(err.Error(), "timed out") || !strings.Contains(err.Error(), n.kubeconfig) {
		t.Errorf("error does not say timed out and name the kubeconfig: %v", err)
	}
	if took < 2*time.Second || took > 8*time.Second {
		t.Errorf("ADD failed after %s, want just over the 2s timeout", took)
	}
	expectUntouched(t, sb)
}

// testStatus: STATUS through libcni passes with a readable kubeconfig and fails without one.
func testStatus(t *testing.T, n *node) {
	good := n.conflist(t, netOpts{mode: iptables.ModeNFTables})
	if err := n.inNode(func(ctx context.Context) error { return n.cni.GetStatusNetworkList(ctx, good) }); err != nil {
		t.Errorf("STATUS with a readable kubeconfig: %v", err)
	}
	missing := n.dir + "/no-such-kubeconfig"
	bad := n.conflist(t, netOpts{mode: iptables.ModeNFTables, kubernetes: map[string]any{"kubeconfig": missing}})
	err := n.inNode(func(ctx context.Context) error { return n.cni.GetStatusNetworkList(ctx, bad) })
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("STATUS with a missing kubeconfig: %v; want an error naming %s", err, missing)
	}
}

// testConcurrentAdds: many ADDs at once on one node all succeed, each netns with its rules.
func testConcurrentAdds(t *testing.T, n *node, count int) {
	ns := "burst"
	n.createNamespace(t, ns, map[string]string{cniplugin.AnnotationSkipOutboundPorts: "3306"})
	list := n.conflist(t, netOpts{mode: iptables.ModeNFTables})
	sbs := make([]*sandbox, count)
	for i := range sbs {
		name := fmt.Sprintf("web-%d", i)
		n.createPod(t, ns, name, shapeClassic, nil, nil)
		sbs[i] = n.newSandbox(t, ns, name)
	}
	errs := make([]error, count)
	var wg sync.WaitGroup
	start := time.Now()
	for i, sb := range sbs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.add(t, list, sb)
		}()
	}
	wg.Wait()
	t.Logf("%d concurrent ADDs took %s", count, time.Since(start))
	want := baseConfig(iptables.ModeNFTables)
	want.OutboundPortsToIgnore = []string{"3306"}
	seen := map[netip.Addr]bool{}
	for i, sb := range sbs {
		if errs[i] != nil {
			t.Errorf("ADD %d: %v", i, errs[i])
			continue
		}
		if seen[sb.podIP] {
			t.Errorf("pod address %s given twice", sb.podIP)
		}
		seen[sb.podIP] = true
		expectRules(t, sb, want)
	}
}

// testLogLines: every line of log_file names the pod, the namespace and the container ID.
func testLogLines(t *testing.T, n *node) {
	b, err := os.ReadFile(n.logFile)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) < 50 {
		t.Fatalf("only %d log lines", len(lines))
	}
	re := regexp.MustCompile(`^time=\S+ level=(DEBUG|INFO|WARN|ERROR) msg=.* cmd=(ADD|CHECK|DEL|STATUS) pod=\S* namespace=\S* container_id=\S*`)
	for _, l := range lines {
		if !re.MatchString(l) {
			t.Errorf("log line without pod, namespace and container ID: %q", l)
			continue
		}
		if strings.Contains(l, "cmd=STATUS") {
			continue // STATUS concerns no pod
		}
		if strings.Contains(l, " pod= ") || strings.Contains(l, " namespace= ") || strings.Contains(l, " container_id= ") {
			t.Errorf("log line with an empty pod, namespace or container ID: %q", l)
		}
	}
}

// testAPIGone stops the API server: ADD of a pod that might be meshed fails clearly and quickly,
// while DEL still succeeds and removes the rules.
func testAPIGone(t *testing.T, n *node) {
	ns := "gone"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	n.createPod(t, ns, "late", shapeClassic, nil, nil)
	list := n.conflist(t, netOpts{mode: iptables.ModeNFTables})
	sb := n.newSandbox(t, ns, "web")
	n.mustAdd(t, list, sb)
	expectRules(t, sb, baseConfig(iptables.ModeNFTables))

	n.kube.Stop()
	late := n.newSandbox(t, ns, "late")
	start := time.Now()
	_, err := n.add(t, list, late)
	if err == nil {
		t.Fatal("ADD succeeded with the API server stopped")
	}
	if took := time.Since(start); took > 7*time.Second {
		t.Errorf("ADD took %s to fail, want within the 5s API timeout", took)
	}
	if !strings.Contains(err.Error(), "might be meshed") || !strings.Contains(err.Error(), n.kubeconfig) {
		t.Errorf("unclear error: %v", err)
	}
	expectUntouched(t, late)
	if err := n.del(list, sb); err != nil {
		t.Fatalf("DEL with the API gone: %v", err)
	}
	expectNoRules(t, sb)
}

// TestCNIWithoutAPI needs no API server: pods that need no lookup pass through the real chain,
// and ADD fails clearly when the kubeconfig is missing.
func TestCNIWithoutAPI(t *testing.T) {
	n := newNode(t, false)
	excluded := n.conflist(t, netOpts{mode: iptables.ModeNFTables, top: map[string]any{"exclude-namespaces": []string{"linkerd-cni"}}})
	sb := n.newSandbox(t, "linkerd-cni", "linkerd-cni-abcde")
	n.expectPassThrough(t, excluded, sb)

	sb = n.newSandbox(t, "web", "api-0")
	_, err := n.add(t, excluded, sb)
	if err == nil || !strings.Contains(err.Error(), "might be meshed") || !strings.Contains(err.Error(), n.kubeconfig) {
		t.Errorf("ADD without a kubeconfig: %v; want a clear failure naming %s", err, n.kubeconfig)
	}
	expectUntouched(t, sb)
	if err := n.del(excluded, sb); err != nil {
		t.Errorf("DEL after a failed ADD: %v", err)
	}
}
