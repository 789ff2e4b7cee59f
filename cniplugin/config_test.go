package cniplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kubemesh/proxy-init/iptables"
)

// linkerdChartConfig is the network config of Linkerd's chart (ConfigMap linkerd-cni-config), with
// the installer's kubeconfig placeholder filled in.
const linkerdChartConfig = `{"name":"linkerd-cni","type":"linkerd-cni","log_level":"info",
 "kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
 "linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102,
   "proxy-gid":-1,"ports-to-redirect":[],"inbound-ports-to-ignore":["4191","4190"],
   "outbound-ports-to-ignore":[],"subnets-to-ignore":[],"simulate":false,
   "use-wait-flag":false,"iptables-mode":"nft","ipv6":false}}`

// prevResults are what a primary plugin returns, per CNI version: before 1.0.0 IPs carry
// "version", from 1.0.0 on they do not.
var prevResults = map[string]string{
	"0.3.0": `{"cniVersion":"0.3.0","interfaces":[{"name":"eth0","mac":"0a:58:cb:00:71:05","sandbox":"/var/run/netns/pod"}],
		"ips":[{"version":"4","address":"203.0.113.5/24","gateway":"203.0.113.1","interface":0}],
		"routes":[{"dst":"0.0.0.0/0","gw":"203.0.113.1"}],"dns":{"nameservers":["203.0.113.53"]}}`,
	"0.3.1": `{"cniVersion":"0.3.1","interfaces":[{"name":"eth0","mac":"0a:58:cb:00:71:05","sandbox":"/var/run/netns/pod"}],
		"ips":[{"version":"4","address":"203.0.113.5/24","gateway":"203.0.113.1","interface":0}],
		"routes":[{"dst":"0.0.0.0/0","gw":"203.0.113.1"}],"dns":{"nameservers":["203.0.113.53"]}}`,
	"0.4.0": `{"cniVersion":"0.4.0","interfaces":[{"name":"eth0","mac":"0a:58:cb:00:71:05","sandbox":"/var/run/netns/pod"}],
		"ips":[{"version":"4","address":"203.0.113.5/24","gateway":"203.0.113.1","interface":0},
		       {"version":"6","address":"2001:db8::5/64","gateway":"2001:db8::1","interface":0}],
		"routes":[{"dst":"0.0.0.0/0","gw":"203.0.113.1"}],"dns":{"nameservers":["203.0.113.53"]}}`,
	"1.0.0": `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","mac":"0a:58:cb:00:71:05","sandbox":"/var/run/netns/pod"}],
		"ips":[{"address":"203.0.113.5/24","gateway":"203.0.113.1","interface":0},
		       {"address":"2001:db8::5/64","gateway":"2001:db8::1","interface":0}],
		"routes":[{"dst":"0.0.0.0/0","gw":"203.0.113.1"}],"dns":{"nameservers":["203.0.113.53"]}}`,
	"1.1.0": `{"cniVersion":"1.1.0","interfaces":[{"name":"eth0","mac":"0a:58:cb:00:71:05","mtu":1500,"sandbox":"/var/run/netns/pod"}],
		"ips":[{"address":"203.0.113.5/24","gateway":"203.0.113.1","interface":0}],
		"routes":[{"dst":"0.0.0.0/0","gw":"203.0.113.1","mtu":1400,"table":100,"scope":0}],"dns":{"nameservers":["203.0.113.53"]}}`,
}

// TestPrevResultAsCNIParsesIt holds ParseConfig's own decoding of prevResult to what CNI's
// ParsePrevResult makes of it: the same result, or the same error, for every version, for a result
// without its version (which takes the config's), and for prevResults that are no result.
func TestPrevResultAsCNIParsesIt(t *testing.T) {
	cases := map[string]struct{ ver, prev string }{
		"no version, 0.3.1":   {"0.3.1", `{"ips":[{"version":"4","address":"203.0.113.5/24"}]}`},
		"no version, 1.0.0":   {"1.0.0", `{"ips":[{"address":"203.0.113.5/24"}]}`},
		"empty":               {"1.0.0", `{}`},
		"null":                {"1.0.0", `null`},
		"a number":            {"1.0.0", `5`},
		"a list":              {"1.1.0", `[]`},
		"bad address":         {"1.0.0", `{"cniVersion":"1.0.0","ips":[{"address":"nope"}]}`},
		"empty version":       {"1.0.0", `{"cniVersion":"","ips":[]}`},
		"older than config":   {"1.1.0", `{"cniVersion":"1.0.0","ips":[{"address":"203.0.113.5/24"}]}`},
		"newer than config":   {"0.4.0", prevResults["1.0.0"]},
		"unknown version":     {"1.0.0", `{"cniVersion":"9.9.9"}`},
		"version in capitals": {"0.4.0", `{"CNIVersion":"0.4.0","ips":[]}`},
	}
	for ver, prev := range prevResults {
		cases[ver] = struct{ ver, prev string }{ver, prev}
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			data := []byte(strings.Replace(linkerdChartConfig, "{", `{"cniVersion":"`+c.ver+`","state-dir":"/var/run/linkerd-cni","prevResult":`+c.prev+",", 1))
			var want types.PluginConf
			wantErr := json.Unmarshal(data, &want)
			if wantErr != nil {
				wantErr = fmt.Errorf("parse linkerd-cni network config: %w", wantErr)
			} else if err := version.ParsePrevResult(&want); err != nil {
				wantErr = fmt.Errorf("parse prevResult of the linkerd-cni network config: %w", err)
			}
			conf, err := ParseConfig(data)
			switch {
			case wantErr != nil || err != nil:
				if fmt.Sprint(err) != fmt.Sprint(wantErr) {
					t.Fatalf("error\n got %v\nwant %v", err, wantErr)
				}
			case (conf.PrevResult == nil) != (want.PrevResult == nil):
				t.Fatalf("prevResult %#v, CNI's %#v", conf.PrevResult, want.PrevResult)
			case want.PrevResult != nil:
				var got, exp bytes.Buffer
				if err := conf.PrevResult.PrintTo(&got); err != nil {
					t.Fatal(err)
				}
				if err := want.PrevResult.PrintTo(&exp); err != nil {
					t.Fatal(err)
				}
				if got.String() != exp.String() || conf.PrevResult.Version() != want.PrevResult.Version() {
					t.Errorf("prevResult (%s)\n got %s\nwant %s (%s)", conf.PrevResult.Version(), got.String(), exp.String(), want.PrevResult.Version())
				}
			}
		})
	}
}

// withVersion returns the chart config as the runtime hands it to the plugin: with cniVersion and
// the previous plugin's result; and with a state-dir of the test's own unless it has one.
func withVersion(t *testing.T, base, ver string) []byte {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(base), &m); err != nil {
		t.Fatal(err)
	}
	m["cniVersion"] = ver
	if _, ok := m["state-dir"]; !ok {
		m["state-dir"] = t.TempDir() // no test touches the node's /var/run/linkerd-cni
	}
	if prev, ok := prevResults[ver]; ok {
		var pr map[string]any
		if err := json.Unmarshal([]byte(prev), &pr); err != nil {
			t.Fatal(err)
		}
		m["prevResult"] = pr
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jsonEqual(t *testing.T, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("result is not JSON: %v\n%s", err, got)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("result differs from prevResult\n got: %s\nwant: %s", got, want)
	}
}

func TestParseConfigPerCNIVersion(t *testing.T) {
	for _, ver := range []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"} {
		t.Run(ver, func(t *testing.T) {
			conf, err := ParseConfig(withVersion(t, linkerdChartConfig, ver))
			if err != nil {
				t.Fatalf("ParseConfig: %v", err)
			}
			if conf.CNIVersion != ver || conf.Name != "linkerd-cni" || conf.Type != "linkerd-cni" {
				t.Errorf("plugin conf = %q %q %q", conf.CNIVersion, conf.Name, conf.Type)
			}
			if conf.PrevResult == nil || conf.PrevResult.Version() != ver {
				t.Fatalf("prevResult not parsed as %s: %#v", ver, conf.PrevResult)
			}
			want := Linkerd{Config: iptables.Config{
				InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1,
				PortsToRedirect: []string{}, InboundPortsToIgnore: []string{"4191", "4190"},
				OutboundPortsToIgnore: []string{}, InboundSubnetsToIgnore: []string{},
				Mode: iptables.ModeNFT,
			}}
			if !reflect.DeepEqual(conf.Linkerd, want) {
				t.Errorf("linkerd block\n got %+v\nwant %+v", conf.Linkerd, want)
			}
			if conf.Kubernetes.Kubeconfig != "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig" || conf.APITimeout() != DefaultAPITimeout {
				t.Errorf("kubernetes block %+v, timeout %s", conf.Kubernetes, conf.APITimeout())
			}

			// ADD of a non-Kubernetes container passes prevResult through unchanged.
			var out, logs bytes.Buffer
			p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: noAPI(t)}
			if err := p.Add(&skel.CmdArgs{ContainerID: "c1", Netns: "/nonexistent", IfName: "eth0", StdinData: withVersion(t, linkerdChartConfig, ver)}); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			jsonEqual(t, out.String(), prevResults[ver])
		})
	}
}

// noAPI fails the test if the plugin builds an API client at all.
func noAPI(t *testing.T) func(*NetConf) (PodAPI, error) {
	return func(*NetConf) (PodAPI, error) {
		t.Errorf("the plugin built an API client, but it should make no API call here")
		return nil, errors.New("no API in this test")
	}
}

func TestParseConfigKeys(t *testing.T) {
	conf, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"linkerd-cni",
		"log_level":"debug","log_file":"/var/log/linkerd-cni.log","exclude-namespaces":["linkerd-cni","kube-system"],
		"max-close-wait-timeout-secs":600,"max-annotation-list-entries":64,"state-dir":"/run/lcni",
		"kubernetes":{"kubeconfig":"/k","k8s_api_root":"https://203.0.113.10:6443","timeout":"2500ms","exclude-namespaces":["monitoring"],"kubelet-pods-socket":"/var/lib/k0s/kubelet/pods-api/pods-api.sock"},
		"agent":{"socket":"/run/linkerd-cni/agent.sock","timeout":"1500ms"},
		"policy":{"type":"k8s","k8s_api_root":"https://x","k8s_auth_token":"t"},
		"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102,"proxy-gid":2103,
		  "ports-to-redirect":[80,"8080"],"inbound-ports-to-ignore":"4190,4191","outbound-ports-to-ignore":[443],
		  "subnets-to-ignore":["10.0.0.0/8"],"outbound-subnets-to-ignore":["192.0.2.0/24"],
		  "simulate":true,"use-wait-flag":true,"iptables-mode":"nftables","ipv6":true,"future-key":1}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := &NetConf{
		LogLevel: "debug", LogFile: "/var/log/linkerd-cni.log", ExcludeNamespaces: []string{"linkerd-cni", "kube-system", "monitoring"},
		Ceilings: Ceilings{MaxCloseWaitSecs: 600, MaxListEntries: 64}, StateDir: "/run/lcni",
		Kubernetes: Kubernetes{Kubeconfig: "/k", APIRoot: "https://203.0.113.10:6443", Timeout: 2500 * time.Millisecond, KubeletPodsSocket: "/var/lib/k0s/kubelet/pods-api/pods-api.sock"},
		Agent:      Agent{Socket: "/run/linkerd-cni/agent.sock", Timeout: 1500 * time.Millisecond},
		Linkerd: Linkerd{Config: iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: 2103,
			PortsToRedirect: []string{"80", "8080"}, InboundPortsToIgnore: []string{"4190,4191"},
			OutboundPortsToIgnore: []string{"443"}, InboundSubnetsToIgnore: []string{"10.0.0.0/8"},
			OutboundSubnetsToIgnore: []string{"192.0.2.0/24"}, Mode: iptables.ModeNFTables, IPv6: true},
			Simulate: true, UseWaitFlag: true},
	}
	// The rules built while validating are those of the linkerd block.
	if rs, err := iptables.Build(want.Linkerd.Config); err != nil || conf.baseRules == nil || conf.baseRules.Hash() != rs.Hash() {
		t.Errorf("base rules %v are not the linkerd block's (%v)", conf.baseRules, err)
	}
	want.PluginConf, want.baseRules = conf.PluginConf, conf.baseRules
	if !reflect.DeepEqual(conf, want) {
		t.Errorf("\n got %+v\nwant %+v", conf, want)
	}
	if !conf.Excluded("linkerd-cni") || conf.Excluded("default") {
		t.Errorf("Excluded wrong for %v", conf.ExcludeNamespaces)
	}
}

// The keys of the features beyond Linkerd's, each proxy-init's flag of the same name.
func TestParseConfigFeatureKeys(t *testing.T) {
	conf, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"linkerd-cni","kubernetes":{"kubeconfig":"/k"},
		"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102,"ipv6":"auto",
		  "redirect-dns-to-port":5353,"dns-servers-only":false,"inbound-mode":"tproxy","outbound-ports-to-redirect":[80,"443","8000-8100"],
		  "outbound-subnets-to-redirect":["10.0.0.0/8","2001:db8::/32"],"interfaces-to-ignore":["net1","eth1"],
		  "uids-to-ignore":[1000,"1001"],"gids-to-ignore":"3000,3001","drop-invalid":true,"reroute-virtual-interfaces":["k6t-eth0","tap0"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Linkerd{Config: iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1, Mode: iptables.ModeLegacy,
		IPv6Auto: true, RedirectDNSToPort: 5353, InboundMode: iptables.InboundTPROXY,
		OutboundPortsToRedirect: []string{"80", "443", "8000-8100"}, OutboundSubnetsToRedirect: []string{"10.0.0.0/8", "2001:db8::/32"},
		InterfacesToIgnore: []string{"net1", "eth1"}, UIDsToIgnore: []string{"1000", "1001"}, GIDsToIgnore: []string{"3000,3001"}, DropInvalid: true,
		RerouteVirtualInterfaces: []string{"k6t-eth0", "tap0"}}}
	if !reflect.DeepEqual(conf.Linkerd, want) {
		t.Errorf("\n got %+v\nwant %+v", conf.Linkerd, want)
	}
	rs := conf.baseRules
	if rs == nil || !rs.IPv6Auto || rs.DNSPort != 5353 || !rs.TPROXY || len(rs.OutboundRedirectPorts) != 3 || len(rs.IgnoreInterfaces) != 2 ||
		len(rs.IgnoreUIDs) != 2 || len(rs.IgnoreGIDs) != 2 || !rs.DropInvalid || len(rs.RerouteInterfaces) != 2 {
		t.Errorf("the rules built from the keys: %+v", rs)
	}
}

func TestParseConfigDefaults(t *testing.T) {
	conf, err := ParseConfig([]byte(`{"cniVersion":"1.0.0","name":"n","type":"linkerd-cni",
		"kubernetes":{"kubeconfig":"/k"},"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"iptables-mode":""}}`))
	if err != nil {
		t.Fatal(err)
	}
	l := conf.Linkerd
	if l.ProxyUID != -1 || l.ProxyGID != -1 || l.Mode != iptables.ModeLegacy || l.IPv6 || l.Simulate {
		t.Errorf("defaults: %+v (want uid/gid -1, empty iptables-mode = legacy, ipv6 off)", l)
	}
	if conf.PrevResult != nil {
		t.Errorf("prevResult %v from a config without one", conf.PrevResult)
	}
	if conf.Agent != (Agent{Socket: DefaultAgentSocket}) {
		t.Errorf("agent defaults %+v, want the socket %s and the default timeout", conf.Agent, DefaultAgentSocket)
	}
	if conf.Kubernetes.KubeletPodsSocket != DefaultKubeletPodsSocket {
		t.Errorf("kubernetes.kubelet-pods-socket %q, want %s", conf.Kubernetes.KubeletPodsSocket, DefaultKubeletPodsSocket)
	}
	// "": the kubelet is never asked.
	conf, err = ParseConfig([]byte(`{"cniVersion":"1.0.0","kubernetes":{"kubeconfig":"/k","kubelet-pods-socket":""},"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140}}`))
	if err != nil || conf.Kubernetes.KubeletPodsSocket != "" {
		t.Errorf(`kubernetes.kubelet-pods-socket "": %+v, %v; want it empty`, conf, err)
	}
}

func TestParseConfigErrors(t *testing.T) {
	base := func(linkerd string) string {
		return `{"cniVersion":"1.0.0","name":"n","type":"linkerd-cni","kubernetes":{"kubeconfig":"/k"},"linkerd":{` + linkerd + `}}`
	}
	ports := `"incoming-proxy-port":4143,"outgoing-proxy-port":4140`
	tests := []struct {
		name, in, want string
	}{
		{"not JSON", `{"cniVersion":`, "parse linkerd-cni network config: unexpected end of JSON input"},
		{"uid as string", base(ports + `,"proxy-uid":"abc"`),
			`invalid linkerd-cni network config: linkerd.proxy-uid "abc": want an integer`},
		{"uid 2^32 would be root", base(ports + `,"proxy-uid":4294967296`),
			`invalid linkerd-cni network config: linkerd.proxy-uid "4294967296": must be -1 (none) or a UID from 1 to 4294967294`},
		{"gid past 2^32-2", base(ports + `,"proxy-gid":4294967295`),
			`invalid linkerd-cni network config: linkerd.proxy-gid "4294967295": must be -1 (none) or a GID from 1 to 4294967294`},
		{"uid zero", base(ports + `,"proxy-uid":0`),
			`invalid linkerd-cni network config: linkerd.proxy-uid "0": refusing to exempt UID 0 (root): use -1 for no exemption`},
		{"missing ports", base(``),
			`invalid linkerd-cni network config: linkerd.incoming-proxy-port "-1": must be set; linkerd.outgoing-proxy-port "-1": must be set`},
		{"bad port list", base(ports + `,"inbound-ports-to-ignore":["4190","70000","9-1"]`),
			`invalid linkerd-cni network config: linkerd.inbound-ports-to-ignore "70000": port 70000 is outside 1-65535; linkerd.inbound-ports-to-ignore "9-1": range 9-1 is reversed`},
		{"port list of objects", base(ports + `,"outbound-ports-to-ignore":[{"a":1}]`),
			`invalid linkerd-cni network config: linkerd.outbound-ports-to-ignore "{\"a\":1}": want a port number or a string such as "1000-2000"`},
		{"bad subnet", base(ports + `,"subnets-to-ignore":["10.0.0.0/33"]`),
			`invalid linkerd-cni network config: linkerd.subnets-to-ignore "10.0.0.0/33": "10.0.0.0/33" is not a valid CIDR`},
		{"bad mode", base(ports + `,"iptables-mode":"ebtables"`),
			`invalid linkerd-cni network config: linkerd.iptables-mode "ebtables": unknown mode; want one of auto, legacy, nft, plain, nftables`},
		{"ipv6 as string", base(ports + `,"ipv6":"yes"`),
			`invalid linkerd-cni network config: linkerd.ipv6 "yes": want true, false or "auto"`},
		{"dns-servers-only is proxy-init's alone", base(ports + `,"redirect-dns-to-port":5353,"dns-servers-only":true`),
			`invalid linkerd-cni network config: linkerd.dns-servers-only "true": not offered by the CNI plugin: it runs before the pod's /etc/resolv.conf exists and would read the node's; leave it out to capture DNS to every nameserver, or set it on proxy-init as an init container`},
		{"the new keys' bad values", base(ports + `,"redirect-dns-to-port":0.5,"inbound-mode":"tproxy6","outbound-ports-to-redirect":[0],` +
			`"outbound-subnets-to-redirect":["10.0.0.0/33"],"interfaces-to-ignore":["eth0/1","a-very-long-name0"],"uids-to-ignore":[4294967295],` +
			`"gids-to-ignore":[{"g":1}],"drop-invalid":"yes"`),
			`invalid linkerd-cni network config: linkerd.redirect-dns-to-port "0.5": want an integer; linkerd.gids-to-ignore "{\"g\":1}": want an ID, a number or a string; ` +
				`linkerd.drop-invalid "yes": want true or false; linkerd.inbound-mode "tproxy6": unknown inbound mode; want redirect or tproxy; ` +
				`linkerd.outbound-ports-to-redirect "0": port 0 is outside 1-65535; linkerd.outbound-subnets-to-redirect "10.0.0.0/33": "10.0.0.0/33" is not a valid CIDR; ` +
				`linkerd.interfaces-to-ignore "eth0/1": holds '/', which the kernel refuses in an interface name; ` +
				`linkerd.interfaces-to-ignore "a-very-long-name0": longer than 15 bytes, the kernel's limit for an interface name; ` +
				`linkerd.uids-to-ignore "4294967295": must be a UID from 1 to 4294967294`},
		{"a virtual machine's interfaces not a list", base(ports + `,"reroute-virtual-interfaces":"tap0"`),
			`invalid linkerd-cni network config: linkerd.reroute-virtual-interfaces "tap0": want a list of interface names`},
		{"a virtual machine's interfaces refused", base(ports + `,"interfaces-to-ignore":["net1"],"reroute-virtual-interfaces":["tap0","net1","lo","tap:0"]`),
			`invalid linkerd-cni network config: linkerd.reroute-virtual-interfaces "tap:0": holds ':', which the kernel refuses in an interface name; ` +
				`linkerd.reroute-virtual-interfaces "net1": also in interfaces-to-ignore: its traffic cannot both skip the proxy and reach it; ` +
				`linkerd.reroute-virtual-interfaces "lo": the pod's own traffic, the proxy's included, arrives on it, not a virtual machine's`},
		{"DNS port out of range", base(ports + `,"redirect-dns-to-port":65536`),
			`invalid linkerd-cni network config: linkerd.redirect-dns-to-port "65536": port is outside 1-65535 (0: capture no DNS)`},
		{"linkerd not an object", `{"cniVersion":"1.0.0","kubernetes":{"kubeconfig":"/k"},"linkerd":[1]}`,
			`invalid linkerd-cni network config: linkerd "[1]": want an object; linkerd.incoming-proxy-port "-1": must be set; linkerd.outgoing-proxy-port "-1": must be set`},
		{"bad log level and timeout, no kubeconfig", `{"cniVersion":"1.0.0","log_level":"loud","kubernetes":{"timeout":"soon"},"linkerd":{` + ports + `}}`,
			`invalid linkerd-cni network config: kubernetes.timeout "soon": want a duration such as "5s"; log_level "loud": want trace, debug, info, warn or error; kubernetes.kubeconfig "": must be set: the plugin reads the pod from the Kubernetes API with it`},
		{"agent socket relative, timeout zero", `{"cniVersion":"1.0.0","agent":{"socket":"agent.sock","timeout":"0s"},"kubernetes":{"kubeconfig":"/k"},"linkerd":{` + ports + `}}`,
			`invalid linkerd-cni network config: agent.timeout "0s": must be positive; agent.socket "agent.sock": not an absolute path`},
		{"kubelet socket relative", `{"cniVersion":"1.0.0","kubernetes":{"kubeconfig":"/k","kubelet-pods-socket":"pods-api.sock"},"linkerd":{` + ports + `}}`,
			`invalid linkerd-cni network config: kubernetes.kubelet-pods-socket "pods-api.sock": not an absolute path`},
		{"kubelet socket not a string", `{"cniVersion":"1.0.0","kubernetes":{"kubeconfig":"/k","kubelet-pods-socket":false},"linkerd":{` + ports + `}}`,
			`invalid linkerd-cni network config: kubernetes.kubelet-pods-socket "false": want a string`},
		{"state-dir relative", `{"cniVersion":"1.0.0","state-dir":"run/linkerd-cni","kubernetes":{"kubeconfig":"/k"},"linkerd":{` + ports + `}}`,
			`invalid linkerd-cni network config: state-dir "run/linkerd-cni": not an absolute path`},
		{"exclude-namespaces not a list", `{"cniVersion":"1.0.0","exclude-namespaces":"linkerd-cni","kubernetes":{"kubeconfig":"/k"},"linkerd":{` + ports + `}}`,
			`invalid linkerd-cni network config: exclude-namespaces "linkerd-cni": want a list of namespace names`},
		{"ceilings zero and not a number", `{"cniVersion":"1.0.0","max-close-wait-timeout-secs":0,"max-annotation-list-entries":"many","kubernetes":{"kubeconfig":"/k"},"linkerd":{` + ports + `}}`,
			`invalid linkerd-cni network config: max-annotation-list-entries "many": want an integer; max-close-wait-timeout-secs "0": must be at least 1`},
		{"kubernetes.exclude-namespaces not a list", `{"cniVersion":"1.0.0","kubernetes":{"kubeconfig":"/k","exclude-namespaces":{"a":1}},"linkerd":{` + ports + `}}`,
			`invalid linkerd-cni network config: kubernetes.exclude-namespaces "{\"a\":1}": want a list of namespace names`},
		{"bad prevResult", `{"cniVersion":"1.0.0","prevResult":{"ips":[{"address":"nope"}]},"kubernetes":{"kubeconfig":"/k"},"linkerd":{` + ports + `}}`,
			`parse prevResult of the linkerd-cni network config: could not parse prevResult: invalid CIDR address: nope`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tt.in))
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			if err.Error() != tt.want {
				t.Errorf("error\n got %q\nwant %q", err.Error(), tt.want)
			}
		})
	}
}

func TestParseConfigLenientForDEL(t *testing.T) {
	conf, err := ParseConfigLenient([]byte(`{"cniVersion":"1.0.0","prevResult":{"ips":[{"address":"nope"}]},
		"linkerd":{"proxy-uid":"abc","iptables-mode":"nftables"}}`))
	if err != nil {
		t.Fatalf("lenient parse refused a config DEL must accept: %v", err)
	}
	if conf.Linkerd.Mode != iptables.ModeNFTables {
		t.Errorf("mode %q, want the decodable keys kept", conf.Linkerd.Mode)
	}
	if _, err := ParseConfigLenient([]byte(`not json`)); err == nil {
		t.Error("undecodable JSON accepted")
	}
}

func TestParseCNIArgs(t *testing.T) {
	tests := []struct {
		in      string
		want    PodArgs
		wantErr string
	}{
		{"", PodArgs{}, ""},
		{"IgnoreUnknown=1;K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0;K8S_POD_INFRA_CONTAINER_ID=abc;K8S_POD_UID=u-1",
			PodArgs{Namespace: "web", Name: "api-0", InfraContainerID: "abc", UID: "u-1"}, ""},
		{"K8S_POD_NAME=a=b;", PodArgs{Name: "a=b"}, ""},
		{"K8S_POD_NAMESPACE=web;garbage", PodArgs{}, `CNI_ARGS "K8S_POD_NAMESPACE=web;garbage": element "garbage" is not KEY=VALUE`},
	}
	for _, tt := range tests {
		got, err := ParseCNIArgs(tt.in)
		if tt.wantErr != "" {
			if err == nil || err.Error() != tt.wantErr {
				t.Errorf("ParseCNIArgs(%q) error %v, want %q", tt.in, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseCNIArgs(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

// fakeAPI serves fixed objects and counts requests; a nil object answers with err.
type fakeAPI struct {
	pod      *Pod
	ns       *Namespace
	svc      *Service
	err      error
	requests []string
}

func (f *fakeAPI) Pod(_ context.Context, ns, name string) (*Pod, error) {
	f.requests = append(f.requests, "pod "+ns+"/"+name)
	if f.pod == nil {
		return nil, f.err
	}
	return f.pod, nil
}

func (f *fakeAPI) Namespace(_ context.Context, name string) (*Namespace, error) {
	f.requests = append(f.requests, "namespace "+name)
	if f.ns == nil {
		return nil, f.err
	}
	return f.ns, nil
}

func (f *fakeAPI) Service(_ context.Context, ns, name string) (*Service, error) {
	f.requests = append(f.requests, "service "+ns+"/"+name)
	if f.svc == nil {
		return nil, fmt.Errorf("service: %w", errors.New("boom"))
	}
	return f.svc, nil
}

func TestAddPassThroughWithoutAPI(t *testing.T) {
	tests := []struct {
		name, args, config string
		wantLog            string
	}{
		{"no pod in CNI_ARGS", "IgnoreUnknown=1", linkerdChartConfig, "not a Kubernetes pod"},
		{"excluded namespace", "K8S_POD_NAMESPACE=linkerd-cni;K8S_POD_NAME=linkerd-cni-x1",
			strings.Replace(linkerdChartConfig, `"log_level":"info",`, `"log_level":"info","exclude-namespaces":["linkerd-cni"],`, 1),
			"namespace is in exclude-namespaces"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, logs bytes.Buffer
			p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: noAPI(t)}
			err := p.Add(&skel.CmdArgs{ContainerID: "c1", Netns: "/nonexistent", IfName: "eth0", Args: tt.args,
				StdinData: withVersion(t, tt.config, "1.0.0")})
			if err != nil {
				t.Fatal(err)
			}
			jsonEqual(t, out.String(), prevResults["1.0.0"])
			if !strings.Contains(logs.String(), tt.wantLog) {
				t.Errorf("log %q lacks %q", logs.String(), tt.wantLog)
			}
		})
	}
}

// Run alone (a NetworkAttachmentDefinition holding only linkerd-cni, as Multus and OpenShift run
// it) there is no prevResult: ADD writes the rules as in a chain and prints an empty result in the
// config's CNI version, which a runtime parses as a success; CHECK checks as in a chain.
func TestAddAndCheckWithoutPrevResult(t *testing.T) {
	for _, ver := range version.All.SupportedVersions() {
		t.Run(ver, func(t *testing.T) {
			var conf map[string]any
			if err := json.Unmarshal(withVersion(t, linkerdChartConfig, ver), &conf); err != nil {
				t.Fatal(err)
			}
			delete(conf, "prevResult")
			stdin, _ := json.Marshal(conf)
			r := newPolicyRig(t, meshedPod(nil, nil))
			args := r.args(t)
			args.StdinData = stdin
			if err := r.plugin.Add(args); err != nil {
				t.Fatalf("ADD without prevResult: %v\n%s", err, r.logs.String())
			}
			res, err := version.NewResult(ver, r.out.Bytes())
			if err != nil {
				t.Fatalf("the result %q is not a CNI %s result: %v", r.out.String(), ver, err)
			}
			if res.Version() != ver {
				t.Errorf("result version %s, want %s", res.Version(), ver)
			}
			var got map[string]any
			if err := json.Unmarshal(r.out.Bytes(), &got); err != nil || got["ips"] != nil || got["interfaces"] != nil || got["ip4"] != nil {
				t.Errorf("the result %s is not empty (%v)", r.out.String(), err)
			}
			if !strings.Contains(r.fake.Dump(), "proxy-init/redirect-all-outgoing-to-proxy-port") {
				t.Errorf("ADD without prevResult wrote:\n%s", r.fake.Dump())
			}
			if err := r.plugin.Check(args); err != nil {
				t.Errorf("CHECK without prevResult: %v", err)
			}
		})
	}
}

func TestAddFailsOnAPIErrorsAndLogsThem(t *testing.T) {
	dir := t.TempDir()
	logFile := filepath.Join(dir, "cni.log")
	conf := strings.Replace(linkerdChartConfig, `"log_level":"info",`, `"log_level":"info","log_file":"`+logFile+`",`, 1)
	api := &fakeAPI{err: errors.New("dial tcp 203.0.113.10:6443: connect: connection refused")}
	var out, logs bytes.Buffer
	p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: func(*NetConf) (PodAPI, error) { return api, nil }}
	err := p.Add(&skel.CmdArgs{ContainerID: "ctr-42", Netns: "/nonexistent", Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0",
		StdinData: withVersion(t, conf, "1.0.0")})
	var ce *types.Error
	if !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater {
		t.Fatalf("err = %#v, want a try-again-later CNI error", err)
	}
	want := "pod web/api-0 might be meshed and cannot be looked up (timeout 10s): dial tcp 203.0.113.10:6443: connect: connection refused"
	if ce.Msg != want {
		t.Errorf("message\n got %q\nwant %q", ce.Msg, want)
	}
	if out.Len() != 0 {
		t.Errorf("stdout %q", out.String())
	}
	file, err := os.ReadFile(logFile)
	if err != nil {
		t.Fatal(err)
	}
	for name, text := range map[string]string{"stderr": logs.String(), "log_file": string(file)} {
		lines := strings.Split(strings.TrimSpace(text), "\n")
		if len(lines) == 0 || !strings.Contains(text, "connection refused") {
			t.Errorf("%s has no error line: %q", name, text)
		}
		for _, l := range lines {
			for _, attr := range []string{"pod=api-0", "namespace=web", "container_id=ctr-42", "cmd=ADD"} {
				if !strings.Contains(l, attr) {
					t.Errorf("%s line %q lacks %s", name, l, attr)
				}
			}
		}
	}
}
