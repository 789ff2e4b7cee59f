package install

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// linkerdEntry is the field set Linkerd's CNI integration tests decode the installed entry into,
// with every unknown key an error: only "policy" and "kubernetes" take any key.
type linkerdEntry struct {
	Name       string         `json:"name"`
	Type       string         `json:"type"`
	LogLevel   string         `json:"log_level"`
	Policy     map[string]any `json:"policy"`
	Kubernetes map[string]any `json:"kubernetes"`
	Linkerd    struct {
		IncomingProxyPort     int      `json:"incoming-proxy-port"`
		OutgoingProxyPort     int      `json:"outgoing-proxy-port"`
		ProxyUID              int      `json:"proxy-uid"`
		ProxyGID              int      `json:"proxy-gid"`
		PortsToRedirect       []int    `json:"ports-to-redirect"`
		InboundPortsToIgnore  []string `json:"inbound-ports-to-ignore"`
		OutboundPortsToIgnore []string `json:"outbound-ports-to-ignore"`
		SubnetsToIgnore       []string `json:"subnets-to-ignore"`
		Simulate              bool     `json:"simulate"`
		UseWaitFlag           bool     `json:"use-wait-flag"`
		IPTablesMode          string   `json:"iptables-mode"`
		IPv6                  bool     `json:"ipv6"`
	} `json:"linkerd"`
}

// decodeAsLinkerd decodes a plugin entry as Linkerd's integration tests do, strictly.
func decodeAsLinkerd(raw []byte) (*linkerdEntry, error) {
	var e linkerdEntry
	d := json.NewDecoder(bytes.NewReader(raw))
	d.DisallowUnknownFields()
	return &e, d.Decode(&e)
}

// TestEntryDecodesAsLinkerdReadsIt installs Linkerd's own integration ConfigMap on a Calico node
// and a k3s flannel node, in both of the modes Linkerd's integration runs, and reads the entry
// back as Linkerd's check does: Linkerd's top-level keys only, with Linkerd's values, and the
// DaemonSet's own namespace still excluded (in the kubernetes block).
func TestEntryDecodesAsLinkerdReadsIt(t *testing.T) {
	tmpl, err := os.ReadFile("testdata/linkerd-integration/cni_network_config.json")
	if err != nil {
		t.Fatal(err)
	}
	nodes := []struct {
		name, netDir, binDir, file, conflist string
	}{
		{"calico", "/etc/cni/net.d", "/opt/cni/bin", "10-calico.conflist",
			`{"name":"k8s-pod-network","cniVersion":"0.3.1","plugins":[{"type":"calico","datastore_type":"kubernetes","ipam":{"type":"calico-ipam"},"policy":{"type":"k8s"},"kubernetes":{"kubeconfig":"/etc/cni/net.d/calico-kubeconfig"}},{"type":"portmap","snat":true,"capabilities":{"portMappings":true}},{"type":"bandwidth","capabilities":{"bandwidth":true}}]}`},
		{"k3s-flannel", "/var/lib/rancher/k3s/agent/etc/cni/net.d", "/var/lib/rancher/k3s/data/cni", "10-flannel.conflist",
			`{"name":"cbr0","cniVersion":"1.0.0","plugins":[{"type":"flannel","delegate":{"hairpinMode":true,"forceAddress":true,"isDefaultGateway":true}},{"type":"portmap","capabilities":{"portMappings":true}},{"type":"bandwidth","capabilities":{"bandwidth":true}}]}`},
	}
	for _, node := range nodes {
		for _, mode := range []string{"legacy", "nft"} {
			t.Run(node.name+"/"+mode, func(t *testing.T) {
				h := newHost(t)
				h.cfg.DestNetDir, h.cfg.DestBinDir = node.netDir, node.binDir
				h.netDir, h.binDir = filepath.Join(h.root, "host", node.netDir), filepath.Join(h.root, "host", node.binDir)
				for _, d := range []string{h.netDir, h.binDir} {
					if err := os.MkdirAll(d, 0o755); err != nil {
						t.Fatal(err)
					}
				}
				h.cfg.NetworkConfig = strings.ReplaceAll(string(tmpl), "$IPTABLES_MODE", mode)
				h.write(t, node.file, node.conflist)
				h.start(t).waitReady(t)

				_, last := lastPlugin(t, h.read(t, node.file))
				raw, _ := json.Marshal(last)
				e, err := decodeAsLinkerd(raw)
				if err != nil {
					t.Fatalf("Linkerd's check would fail on the entry: %v\n%s", err, raw)
				}
				l := e.Linkerd
				if e.Name != "linkerd-cni" || l.IncomingProxyPort != 4143 || l.OutgoingProxyPort != 4140 || l.ProxyUID != 2102 ||
					l.ProxyGID != 2102 || l.Simulate || l.UseWaitFlag || len(l.PortsToRedirect) > 0 ||
					!slices.Equal(l.InboundPortsToIgnore, []string{"4191", "4190"}) || l.IPTablesMode != mode {
					t.Errorf("the entry's values differ from what Linkerd's check wants: %s", raw)
				}
				if ex, _ := e.Kubernetes["exclude-namespaces"].([]any); len(ex) != 1 || ex[0] != "linkerd-cni" {
					t.Errorf("kubernetes.exclude-namespaces = %v, want [linkerd-cni]: the plugin would look up its own DaemonSet's pods", e.Kubernetes["exclude-namespaces"])
				}
				for _, k := range []string{"timeout", "k8s_api_root", "kubelet-pods-socket"} {
					if _, ok := e.Kubernetes[k]; ok {
						t.Errorf("kubernetes.%s is set though the ConfigMap does not set it: %s", k, raw)
					}
				}
			})
		}
	}
}

// TestEntryKeysOnlyWhenSet: the keys beyond Linkerd's appear in the entry exactly when the
// user's template sets them, and the strict decode then names the one Linkerd does not know.
func TestEntryKeysOnlyWhenSet(t *testing.T) {
	vars := map[string]string{"__KUBECONFIG_FILEPATH__": "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"}
	e, _, err := renderEntry("CNI_NETWORK_CONFIG", DefaultNetworkConfig, vars, "linkerd-cni")
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(e.raw, &top); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"log_file", "exclude-namespaces", "agent"} {
		if _, ok := top[k]; ok {
			t.Errorf("the default entry has %q, which no one set: %s", k, e.raw)
		}
	}
	if _, err := decodeAsLinkerd(e.raw); err != nil {
		t.Errorf("the default entry fails Linkerd's decode: %v\n%s", err, e.raw)
	}

	user := `{"name":"linkerd-cni","type":"linkerd-cni","log_file":"/var/log/linkerd-cni.log",` +
		`"kubernetes":{"kubeconfig":"__KUBECONFIG_FILEPATH__","timeout":"5s"},"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140}}`
	e, _, err = renderEntry("CNI_NETWORK_CONFIG", user, vars, "linkerd-cni")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"name":"linkerd-cni","type":"linkerd-cni","log_file":"/var/log/linkerd-cni.log",` +
		`"kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig","timeout":"5s","exclude-namespaces":["linkerd-cni"]},` +
		`"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140}}`
	if string(e.raw) != want {
		t.Errorf("entry\n got %s\nwant %s", e.raw, want)
	}
	if _, err := decodeAsLinkerd(e.raw); err == nil || !strings.Contains(err.Error(), `unknown field "log_file"`) {
		t.Errorf("strict decode of a user's log_file: %v, want it named as unknown", err)
	}
}
