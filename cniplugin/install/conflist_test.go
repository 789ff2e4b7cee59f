package install

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

const ourType = "linkerd-cni"

var ourEntry = []byte(`{"name":"linkerd-cni","type":"linkerd-cni","kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"}}`)

// calicoConflist is shaped like Calico's 10-calico.conflist, with an
// unknown top-level key and odd number spellings that a decode/encode round
// trip would rewrite.
const calicoConflist = `{
  "name": "k8s-pod-network",
  "cniVersion": "0.3.1",
  "x-vendor-extension": {"keep": [1.0, 2e3, "\u00e9"]},
  "plugins": [
    {
      "type": "calico",
      "log_level": "info",
      "datastore_type": "kubernetes",
      "mtu": 1440,
      "ipam": {"type": "calico-ipam"},
      "policy": {"type": "k8s"},
      "kubernetes": {"kubeconfig": "/etc/cni/net.d/calico-kubeconfig"}
    },
    {
      "type": "portmap",
      "snat": true,
      "capabilities": {"portMappings": true}
    },
    {"type": "bandwidth", "capabilities": {"bandwidth": true}}
  ]
}
`

// flannelConf is a single-plugin .conf like flannel's older installs.
const flannelConf = `{
	"name": "cbr0",
	"cniVersion": "0.3.1",
	"type": "flannel",
	"delegate": {
		"hairpinMode": true,
		"isDefaultGateway": true
	}
}
`

func pluginTypes(t *testing.T, data []byte) []string {
	t.Helper()
	doc, err := parseList(data)
	if err != nil {
		t.Fatalf("parse result: %v\n%s", err, data)
	}
	return doc.types
}

func TestAppendEntry(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		wantTypes []string
		// original is what removal must restore; "" means in.
		original string
	}{
		{
			name:      "calico conflist, indented",
			in:        calicoConflist,
			wantTypes: []string{"calico", "portmap", "bandwidth", ourType},
		},
		{
			name:      "compact one-line list",
			in:        `{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"ptp"},{"type":"portmap"}]}`,
			wantTypes: []string{"ptp", "portmap", ourType},
		},
		{
			name:      "tab indented, CRLF line ends",
			in:        "{\r\n\t\"name\": \"n\",\r\n\t\"plugins\": [\r\n\t\t{\"type\": \"bridge\"}\r\n\t]\r\n}\r\n",
			wantTypes: []string{"bridge", ourType},
		},
		{
			name:      "empty plugins",
			in:        `{"name":"n","plugins":[ ]}`,
			wantTypes: []string{ourType},
		},
		{
			name:      "old entry in the middle is replaced and moved last",
			in:        `{"name":"n","plugins":[{"type":"cilium-cni"},{"type":"linkerd-cni","stale":"token"},{"type":"portmap"}]}`,
			wantTypes: []string{"cilium-cni", "portmap", ourType},
			original:  `{"name":"n","plugins":[{"type":"cilium-cni"},{"type":"portmap"}]}`,
		},
		{
			name:      "duplicated entries collapse to one",
			in:        `{"name":"n","plugins":[{"type":"linkerd-cni"},{"type":"bridge"},{"type":"linkerd-cni"}]}`,
			wantTypes: []string{"bridge", ourType},
			original:  `{"name":"n","plugins":[{"type":"bridge"}]}`,
		},
		{
			name:      "string containing brackets and quotes",
			in:        `{"name":"n]}","plugins":[{"type":"bridge","x":"a\"],{b"}]}`,
			wantTypes: []string{"bridge", ourType},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := appendEntry([]byte(tt.in), ourType, ourEntry)
			if err != nil {
				t.Fatalf("appendEntry: %v", err)
			}
			if got := pluginTypes(t, out); strings.Join(got, ",") != strings.Join(tt.wantTypes, ",") {
				t.Errorf("plugin types = %v, want %v\n%s", got, tt.wantTypes, out)
			}
			// A real CNI runtime must load it.
			if _, err := libcni.ConfListFromBytes(out); err != nil {
				t.Errorf("libcni rejects the result: %v\n%s", err, out)
			}
			// Appending again changes nothing.
			again, err := appendEntry(out, ourType, ourEntry)
			if err != nil || !bytes.Equal(again, out) {
				t.Errorf("second append changed the file (err %v):\n%s\n---\n%s", err, out, again)
			}
			// Our entry, decoded, is what we asked for.
			doc, _ := parseList(out)
			last := doc.elems[len(doc.elems)-1]
			var got, want any
			_ = json.Unmarshal(out[last.start:last.end], &got)
			_ = json.Unmarshal(ourEntry, &want)
			gb, _ := json.Marshal(got)
			wb, _ := json.Marshal(want)
			if !bytes.Equal(gb, wb) {
				t.Errorf("our entry = %s, want %s", gb, wb)
			}
			// Removal restores the original bytes exactly.
			orig := tt.original
			if orig == "" {
				orig = tt.in
			}
			back, n, err := removeEntries(out, ourType)
			if err != nil || n != 1 {
				t.Fatalf("removeEntries: n=%d err=%v", n, err)
			}
			if string(back) != orig {
				t.Errorf("removal did not restore the original bytes:\n got %q\nwant %q", back, orig)
			}
		})
	}
}

func TestAppendEntryIndentsLikeNeighbours(t *testing.T) {
	out, err := appendEntry([]byte(calicoConflist), ourType, ourEntry)
	if err != nil {
		t.Fatal(err)
	}
	want := "    {\"type\": \"bandwidth\", \"capabilities\": {\"bandwidth\": true}},\n    {\n      \"name\": \"linkerd-cni\",\n"
	if !strings.Contains(string(out), want) {
		t.Errorf("entry not indented like the plugins before it:\n%s", out)
	}
}

func TestParseListErrors(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"truncated", `{"name":"n","plugins":[{"type":"bridge"}`, "invalid JSON"},
		{"trailing comma", `{"plugins":[{"type":"bridge"},]}`, "invalid JSON at offset"},
		{"not an object", `["plugins"]`, "not a JSON object"},
		{"no plugins", `{"name":"n","type":"bridge"}`, `no "plugins" list`},
		{"plugins not a list", `{"plugins":{"type":"bridge"}}`, `"plugins": not a JSON array`},
		{"plugin not an object", `{"plugins":[{"type":"bridge"},"x"]}`, "plugins[1] is not an object"},
		{"empty file", ``, "invalid JSON"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := appendEntry([]byte(tt.in), ourType, ourEntry)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %v, want it to contain %q", err, tt.want)
			}
			if _, _, err := removeEntries([]byte(tt.in), ourType); err == nil {
				t.Errorf("removeEntries accepted %q", tt.in)
			}
		})
	}
}

func TestConvertConf(t *testing.T) {
	tests := []struct {
		name, in, wantName, wantVersion string
	}{
		{"flannel", flannelConf, "cbr0", "0.3.1"},
		{"no name uses the file stem", `{"cniVersion":"1.0.0","type":"bridge","bridge":"cni0"}`, "10-bridge", "1.0.0"},
		{"no version", `{"name":"x","type":"bridge"}`, "x", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := convertConf([]byte(tt.in), ourType, ourEntry, "10-bridge")
			if err != nil {
				t.Fatalf("convertConf: %v", err)
			}
			list, err := libcni.ConfListFromBytes(out)
			if err != nil {
				t.Fatalf("libcni rejects the result: %v\n%s", err, out)
			}
			if list.Name != tt.wantName {
				t.Errorf("name = %q, want %q", list.Name, tt.wantName)
			}
			if tt.wantVersion != "" && list.CNIVersion != tt.wantVersion {
				t.Errorf("cniVersion = %q, want %q", list.CNIVersion, tt.wantVersion)
			}
			if got := pluginTypes(t, out); len(got) != 2 || got[1] != ourType {
				t.Errorf("plugin types = %v", got)
			}
			other, ok := soleOtherPlugin(out, ourType)
			if !ok || !sameJSONText(other, []byte(tt.in)) {
				t.Errorf("the original plugin is not kept (up to whitespace):\n%s", out)
			}
		})
	}
	for _, bad := range []struct{ in, want string }{
		{`{"name":"x"}`, `no "type" string`},
		{`{"name":"x","type":"linkerd-cni"}`, "configures linkerd-cni itself"},
		{`{"name":"x",`, "invalid JSON"},
	} {
		if _, err := convertConf([]byte(bad.in), ourType, ourEntry, "s"); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("convertConf(%s) error = %v, want %q", bad.in, err, bad.want)
		}
	}
}

func TestRenderEntry(t *testing.T) {
	vars := map[string]string{
		"__KUBECONFIG_FILEPATH__":     "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig",
		"__KUBERNETES_SERVICE_HOST__": "2001:db8::1",
	}
	tests := []struct {
		name, tmpl, ns string
		wantExclude    []string
		wantWarn       bool
		wantErr        string
	}{
		{name: "default config", tmpl: DefaultNetworkConfig, ns: "linkerd-cni", wantExclude: []string{"linkerd-cni"}},
		{name: "no namespace", tmpl: DefaultNetworkConfig},
		{name: "merges an existing list", tmpl: `{"type":"linkerd-cni","exclude-namespaces":["kube-system"]}`, ns: "linkerd-cni",
			wantExclude: []string{"kube-system", "linkerd-cni"}},
		{name: "no duplicate", tmpl: `{"type":"linkerd-cni","exclude-namespaces":["linkerd-cni"]}`, ns: "linkerd-cni",
			wantExclude: []string{"linkerd-cni"}},
		{name: "merges the kubernetes block's list", tmpl: `{"type":"linkerd-cni","kubernetes":{"exclude-namespaces":["kube-system"],"kubeconfig":"k"}}`, ns: "linkerd-cni",
			wantExclude: []string{"kube-system", "linkerd-cni"}},
		{name: "no duplicate in the kubernetes block", tmpl: `{"type":"linkerd-cni","kubernetes":{"exclude-namespaces":["linkerd-cni"]}}`, ns: "linkerd-cni",
			wantExclude: []string{"linkerd-cni"}},
		{name: "creates the kubernetes block", tmpl: `{"type":"linkerd-cni"}`, ns: "linkerd-cni", wantExclude: []string{"linkerd-cni"}},
		{name: "kubernetes not an object", tmpl: `{"type":"linkerd-cni","kubernetes":[]}`, ns: "x", wantErr: `"kubernetes" must be an object`},
		{name: "bad kubernetes exclude list", tmpl: `{"type":"linkerd-cni","kubernetes":{"exclude-namespaces":{}}}`, ns: "x", wantErr: `"kubernetes.exclude-namespaces" must be a list of strings`},
		{name: "token placeholder warns and is emptied", tmpl: `{"type":"linkerd-cni","kubernetes":{"token":"__SERVICEACCOUNT_TOKEN__"}}`, wantWarn: true},
		{name: "invalid JSON", tmpl: `{"type":"linkerd-cni",}`, wantErr: "CNI_NETWORK_CONFIG: invalid JSON at offset"},
		{name: "no type", tmpl: `{"name":"linkerd-cni"}`, wantErr: `"type" must be a non-empty string`},
		{name: "type with a slash", tmpl: `{"type":"../sh"}`, wantErr: "must be a plain file name"},
		{name: "bad exclude list", tmpl: `{"type":"linkerd-cni","exclude-namespaces":"a"}`, ns: "x", wantErr: "must be a list of strings"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, warns, err := renderEntry("CNI_NETWORK_CONFIG", tt.tmpl, vars, tt.ns)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (len(warns) > 0) != tt.wantWarn {
				t.Errorf("warnings = %q", warns)
			}
			var got struct {
				Type       string   `json:"type"`
				Exclude    []string `json:"exclude-namespaces"`
				Kubernetes struct {
					Kubeconfig string   `json:"kubeconfig"`
					Exclude    []string `json:"exclude-namespaces"`
					Token      *string
				} `json:"kubernetes"`
			}
			if err := json.Unmarshal(e.raw, &got); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(e.raw), "__") {
				t.Errorf("placeholder left in %s", e.raw)
			}
			if all := append(got.Exclude, got.Kubernetes.Exclude...); strings.Join(all, ",") != strings.Join(tt.wantExclude, ",") {
				t.Errorf("exclude-namespaces (top level, then kubernetes block) = %v, want %v", all, tt.wantExclude)
			}
			if e.typ != "linkerd-cni" {
				t.Errorf("type = %q", e.typ)
			}
		})
	}
	// The default config's kubeconfig placeholder and key order survive.
	e, _, err := renderEntry("x", DefaultNetworkConfig, vars, "linkerd-cni")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"name":"linkerd-cni","type":"linkerd-cni","log_level":"info","kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig","exclude-namespaces":["linkerd-cni"]},"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102,"proxy-gid":-1,"ports-to-redirect":[],"inbound-ports-to-ignore":["4191","4190"],"outbound-ports-to-ignore":[],"subnets-to-ignore":[],"simulate":false,"use-wait-flag":false,"iptables-mode":"nft","ipv6":false}}`
	if string(e.raw) != want {
		t.Errorf("rendered default config:\n got %s\nwant %s", e.raw, want)
	}
}
