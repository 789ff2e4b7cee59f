package install

// The linkerd2-cni chart (deploy/charts/linkerd2-cni), rendered with Helm's own library: the
// renderings every manifest test runs on, the generated deploy/linkerd-cni held to the chart,
// values refused at render time, and helm lint.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/test/helmchart"
	"github.com/kubemesh/proxy-init/validator"
)

// rendering is one set of manifests the manifest tests check.
type rendering struct {
	name string
	ms   []manifest
	// values rendered the chart; nil for deploy/linkerd-cni as it is on disk.
	values map[string]any
	// second is the DaemonSet's second container: "agent" (linkerd-cni-agent), "repair"
	// (repair-controller) or "" (none); with one, the ClusterRole grants "create events".
	second string
	// deletes: the ClusterRole grants "delete pods" (the repair controller, the agent's delete
	// mode).
	deletes bool
	// privileged: install-cni and the agent run privileged (the privileged value).
	privileged bool
	// seLinuxType: install-cni and the agent run in this SELinux type (spc_t with openshift).
	seLinuxType string
	// standalone is LINKERD_CNI_STANDALONE_CONF ("" for none: the plugin is chained).
	standalone string
	// netDir and binDir are the node's CNI directories the rendering uses.
	netDir, binDir string
	// config is what its cni_network_config must mean (parsed by the plugin's own parser).
	config string
	// noLookups and noAudits: the agent serves no socket, audits nothing; pidFallback: it finds
	// namespaces through sandbox processes too.
	noLookups, noAudits, pidFallback bool
}

// ourImage is the image override a Linkerd values file needs (Linkerd's own is refused).
var ourImage = map[string]any{"image": map[string]any{"name": "ghcr.io/kubemesh/linkerd-cni", "version": "v0.1.0"}}

// linkerdUserConfig is what Linkerd's chart renders for testdata/linkerd-2.20-user.yaml: the
// admin and control ports, then the user's, inbound.
const linkerdUserConfig = `{"name":"linkerd-cni","type":"linkerd-cni","log_level":"debug",
 "kubernetes":{"kubeconfig":"__KUBECONFIG_FILEPATH__"},
 "linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102,"proxy-gid":2103,
   "ports-to-redirect":[8080,9090],"inbound-ports-to-ignore":["4191","4190","25","443","3306","5432-5433"],
   "outbound-ports-to-ignore":["25","587","11211"],"simulate":false,"use-wait-flag":true,
   "iptables-mode":"legacy","ipv6":true}}`

// loadChart loads the chart from the repository.
func loadChart(t testing.TB) *chart.Chart {
	t.Helper()
	ch, err := helmchart.Load(filepath.Dir(deployDir(t)))
	if err != nil {
		t.Fatal(err)
	}
	return ch
}

// valuesFile reads a values file of testdata.
func valuesFile(t testing.TB, name string) map[string]any {
	t.Helper()
	v, err := chartutil.ReadValuesFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// merge returns base with over laid on it, maps merged key by key (as helm's --set over -f).
func merge(base, over map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range base {
		out[k] = v
	}
	for k, v := range over {
		if om, ok := v.(map[string]any); ok {
			if bm, ok := out[k].(map[string]any); ok {
				out[k] = merge(bm, om)
				continue
			}
		}
		out[k] = v
	}
	return out
}

// renderChart renders the chart with values into manifests.
func renderChart(t testing.TB, ch *chart.Chart, values map[string]any) []manifest {
	t.Helper()
	files, err := helmchart.Render(ch, values)
	if err != nil {
		t.Fatalf("render the chart with %v: %v", values, err)
	}
	var out []manifest
	for _, name := range helmchart.Names(files) {
		out = append(out, parseManifests(t, "chart:"+name, []byte(files[name]))...)
	}
	return out
}

// renderings are deploy/linkerd-cni (the default rendering, on disk), the chart with Linkerd
// 2.20's default values and with a Linkerd user's values file, and each distribution preset.
func renderings(t testing.TB) []rendering {
	t.Helper()
	ch := loadChart(t)
	dir := filepath.Join(deployDir(t), "linkerd-cni")
	withNS := map[string]any{"createNamespace": true}
	out := []rendering{
		{name: "defaults", ms: loadManifests(t, dir), second: "agent", netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: DefaultNetworkConfig},
		{name: "linkerd-2.20-defaults", values: merge(merge(valuesFile(t, "linkerd-2.20-defaults.yaml"), ourImage), withNS), second: "agent",
			netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: DefaultNetworkConfig},
		{name: "linkerd-2.20-user", values: merge(valuesFile(t, "linkerd-2.20-user.yaml"), withNS), second: "agent",
			netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: linkerdUserConfig},
		// Where containerd looks with k3s's built-in flannel: the stable bin dir since the
		// October 2024 releases (k3s-io/k3s#10868), not data/current/bin.
		// With the socket-LB check (k3s with Cilium is where socket-LB bites).
		{name: "k3s", values: merge(withNS, map[string]any{"distribution": "k3s", "socketLBCheck": map[string]any{"enabled": true}}), second: "agent",
			netDir: "/var/lib/rancher/k3s/agent/etc/cni/net.d", binDir: "/var/lib/rancher/k3s/data/cni", config: DefaultNetworkConfig},
		// k3s with its own CNI: containerd's default directories, k3s's socket.
		{name: "k3s-custom-cni", values: merge(withNS, map[string]any{"distribution": "k3s-custom-cni"}), second: "agent",
			netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: DefaultNetworkConfig},
		{name: "rke2", values: merge(withNS, map[string]any{"distribution": "rke2"}), second: "agent",
			netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: DefaultNetworkConfig},
		{name: "gke", values: merge(withNS, map[string]any{"distribution": "gke"}), second: "agent",
			netDir: "/etc/cni/net.d", binDir: "/home/kubernetes/bin", config: DefaultNetworkConfig},
		{name: "microk8s", values: merge(withNS, map[string]any{"distribution": "microk8s"}), second: "agent",
			netDir: "/var/snap/microk8s/current/args/cni-network", binDir: "/var/snap/microk8s/current/opt/cni/bin", config: DefaultNetworkConfig},
		// Multus's directory for NetworkAttachmentDefinitions, where the plugin's config is
		// written alone: chaining into OVN-Kubernetes's 10-ovn-kubernetes.conf would rename the
		// file Multus and ovnkube-node's readiness probe look for.
		{name: "openshift", values: merge(withNS, map[string]any{"distribution": "openshift"}), second: "agent", seLinuxType: "spc_t",
			netDir: "/etc/cni/multus/net.d", binDir: "/var/lib/cni/bin", config: DefaultNetworkConfig, standalone: "linkerd-cni.conf"},
		// The privileged value wins over the preset's SELinux type, which it makes needless.
		{name: "openshift-privileged", values: merge(withNS, map[string]any{"distribution": "openshift", "privileged": true}), second: "agent", privileged: true,
			netDir: "/etc/cni/multus/net.d", binDir: "/var/lib/cni/bin", config: DefaultNetworkConfig, standalone: "linkerd-cni.conf"},
		{name: "agent-delete-mode", values: merge(withNS, map[string]any{"agent": map[string]any{"mode": "delete"}}), second: "agent", deletes: true,
			netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: DefaultNetworkConfig},
		{name: "agent-pid-fallback", values: merge(withNS, map[string]any{"agent": map[string]any{"pidFallback": true}}), second: "agent", pidFallback: true,
			netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: DefaultNetworkConfig},
		{name: "agent-no-audits", values: merge(withNS, map[string]any{"agent": map[string]any{"auditPeriod": "0s", "pidFallback": true}}), second: "agent", noAudits: true,
			netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: DefaultNetworkConfig},
		{name: "agent-events-only", values: merge(withNS, map[string]any{"agent": map[string]any{"auditPeriod": "0m", "lookups": false}}), second: "agent", noAudits: true, noLookups: true,
			netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: DefaultNetworkConfig},
		{name: "repair-controller-only", values: merge(withNS, map[string]any{"agent": map[string]any{"enabled": false}}), second: "repair", deletes: true,
			netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: DefaultNetworkConfig},
		{name: "neither", values: merge(withNS, map[string]any{"agent": map[string]any{"enabled": false}, "repairController": map[string]any{"enabled": false}}),
			netDir: "/etc/cni/net.d", binDir: "/opt/cni/bin", config: DefaultNetworkConfig},
	}
	for i := range out {
		if out[i].values != nil {
			out[i].ms = renderChart(t, ch, out[i].values)
		}
	}
	return out
}

// TestManifestsUpToDate holds deploy/linkerd-cni to the chart: it must be exactly the chart's
// default rendering (`make manifests`), with no other file.
func TestManifestsUpToDate(t *testing.T) {
	want, err := helmchart.Manifests(loadChart(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(deployDir(t), "linkerd-cni")
	var have []string
	for _, pattern := range []string{"*.yaml", "optional/*.yaml"} {
		m, err := filepath.Glob(filepath.Join(dir, pattern))
		if err != nil {
			t.Fatal(err)
		}
		have = append(have, m...)
	}
	for _, p := range have {
		rel, _ := filepath.Rel(dir, p)
		got, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		text, ok := want[rel]
		switch {
		case !ok:
			t.Errorf("deploy/linkerd-cni/%s is not rendered by the chart: run `make manifests`", rel)
		case string(got) != text:
			t.Errorf("deploy/linkerd-cni/%s is stale: run `make manifests`", rel)
		}
		delete(want, rel)
	}
	for rel := range want {
		t.Errorf("deploy/linkerd-cni/%s is missing: run `make manifests`", rel)
	}
}

// TestChartConfigMeansWhatLinkerdsDoes parses each rendering's cni_network_config with the
// plugin's own parser and compares it with what Linkerd's chart renders for the same values.
func TestChartConfigMeansWhatLinkerdsDoes(t *testing.T) {
	for _, r := range renderings(t) {
		t.Run(r.name, func(t *testing.T) {
			got := configMapConfig(t, r.ms)
			g, err := cniplugin.ParseConfig([]byte(got))
			if err != nil {
				t.Fatalf("the plugin refuses the rendered config: %v\n%s", err, got)
			}
			w, err := cniplugin.ParseConfig([]byte(r.config))
			if err != nil {
				t.Fatal(err)
			}
			// An empty list and a missing key mean the same. The rules built from each are
			// derived from the compared fields.
			if d := cmp.Diff(w, g, cmpopts.EquateEmpty(), cmpopts.IgnoreUnexported(cniplugin.NetConf{})); d != "" {
				t.Errorf("rendered config (-want +got):\n%s\n(rendered %s)", d, got)
			}
		})
	}
}

// configMapConfig returns cni_network_config of the linkerd-cni-config ConfigMap.
func configMapConfig(t testing.TB, ms []manifest) string {
	t.Helper()
	for _, m := range ms {
		if m.obj.GetKind() == "ConfigMap" && m.obj.GetName() == "linkerd-cni-config" {
			s, _, _ := unstructured.NestedString(m.obj.Object, "data", "cni_network_config")
			return s
		}
	}
	t.Fatal("no ConfigMap linkerd-cni-config")
	return ""
}

// TestChartOurValues renders our own keys: the plugin's new config keys, and the node taint's
// argument and objects.
func TestChartOurValues(t *testing.T) {
	ms := renderChart(t, loadChart(t), map[string]any{
		"logFile": "/var/log/linkerd-cni.log", "excludeNamespaces": []any{"kube-system", "monitoring"},
		"iptablesMode": "auto", "nodeTaint": "linkerd.io/cni-not-ready",
		"installer": map[string]any{"adminAddr": "[::1]:9992"},
	})
	var conf map[string]any
	if err := json.Unmarshal([]byte(configMapConfig(t, ms)), &conf); err != nil {
		t.Fatal(err)
	}
	if conf["log_file"] != "/var/log/linkerd-cni.log" || !reflect.DeepEqual(conf["kubernetes"].(map[string]any)["exclude-namespaces"], []any{"kube-system", "monitoring"}) ||
		conf["linkerd"].(map[string]any)["iptables-mode"] != "auto" {
		t.Errorf("config %v lacks log_file, kubernetes.exclude-namespaces or iptables-mode auto", conf)
	}
	kinds := map[string]bool{}
	for _, m := range ms {
		kinds[m.obj.GetKind()+"/"+m.obj.GetName()] = true
	}
	for _, k := range []string{"ClusterRole/linkerd-cni-node-taint", "ClusterRoleBinding/linkerd-cni-node-taint",
		"ValidatingAdmissionPolicy/linkerd-cni-node-taint", "ValidatingAdmissionPolicyBinding/linkerd-cni-node-taint"} {
		if !kinds[k] {
			t.Errorf("nodeTaint renders no %s", k)
		}
	}
	install := container(t, ms, "install-cni")
	args, _, _ := unstructured.NestedStringSlice(install, "args")
	if !slices.Contains(args, "--node-taint=linkerd.io/cni-not-ready") || !slices.Contains(args, "--admin-addr=[::1]:9992") {
		t.Errorf("install-cni args %q", args)
	}
	if host, _, _ := unstructured.NestedString(install, "readinessProbe", "httpGet", "host"); host != "::1" {
		t.Errorf("readiness probe host %q, want ::1", host)
	}
}

// TestChartKubeletPodsAPI: the agent gets the kubelet's pods-api directory, read-only, from
// kubeletRootDir (any root dir, a trailing slash or not), and the flag naming its socket there;
// with kubeletRootDir "" or without lookups, neither the mount nor the socket. The plugin's config
// names the socket only for a root dir other than the kubelet's default (the plugin's own
// default), and names none ("") with kubeletRootDir "".
func TestChartKubeletPodsAPI(t *testing.T) {
	ch := loadChart(t)
	for _, tc := range []struct {
		name    string
		values  map[string]any
		hostDir string // "" for no mount
		key     string // the config's kubernetes.kubelet-pods-socket, "-" for absent
	}{
		{"default", nil, "/var/lib/kubelet/pods-api", "-"},
		{"the default with a slash", map[string]any{"kubeletRootDir": "/var/lib/kubelet/"}, "/var/lib/kubelet/pods-api", "-"},
		{"another root dir", map[string]any{"kubeletRootDir": "/var/lib/k0s/kubelet/"}, "/var/lib/k0s/kubelet/pods-api", "/var/lib/k0s/kubelet/pods-api/pods-api.sock"},
		{"off", map[string]any{"kubeletRootDir": ""}, "", ""},
		{"without lookups", map[string]any{"agent": map[string]any{"lookups": false}}, "", "-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := renderChart(t, ch, tc.values)
			var conf struct {
				Kubernetes map[string]any `json:"kubernetes"`
			}
			if err := json.Unmarshal([]byte(configMapConfig(t, ms)), &conf); err != nil {
				t.Fatal(err)
			}
			if got, ok := conf.Kubernetes["kubelet-pods-socket"]; (tc.key == "-") == ok || ok && got != tc.key {
				t.Errorf("the plugin's kubernetes block %v, want kubelet-pods-socket %q (- for absent)", conf.Kubernetes, tc.key)
			}
			agent := container(t, ms, "linkerd-cni-agent")
			args, _, _ := unstructured.NestedStringSlice(agent, "args")
			wantArg := "--kubelet-pods-socket="
			if tc.hostDir != "" {
				wantArg += "/host/kubelet/pods-api/pods-api.sock"
			}
			if !slices.Contains(args, wantArg) {
				t.Errorf("agent args %q lack %s", args, wantArg)
			}
			mounts, _, _ := unstructured.NestedSlice(agent, "volumeMounts")
			var mount map[string]any
			for _, m := range mounts {
				if m.(map[string]any)["name"] == "kubelet-pods-api" {
					mount = m.(map[string]any)
				}
			}
			var volume map[string]any
			for _, m := range ms {
				if m.obj.GetKind() != "DaemonSet" {
					continue
				}
				vols, _, _ := unstructured.NestedSlice(m.obj.Object, "spec", "template", "spec", "volumes")
				for _, v := range vols {
					if v.(map[string]any)["name"] == "kubelet-pods-api" {
						volume = v.(map[string]any)
					}
				}
			}
			if tc.hostDir == "" {
				if mount != nil || volume != nil {
					t.Errorf("mount %v, volume %v; want none", mount, volume)
				}
				return
			}
			if mount == nil || mount["mountPath"] != "/host/kubelet/pods-api" || mount["readOnly"] != true {
				t.Errorf("agent mount %v, want /host/kubelet/pods-api read-only", mount)
			}
			if path, _, _ := unstructured.NestedString(volume, "hostPath", "path"); path != tc.hostDir {
				t.Errorf("volume %v, want hostPath %s", volume, tc.hostDir)
			}
		})
	}
}

// container returns the DaemonSet's container named name.
func container(t testing.TB, ms []manifest, name string) map[string]any {
	t.Helper()
	for _, m := range ms {
		if m.obj.GetKind() != "DaemonSet" {
			continue
		}
		cs, _, _ := unstructured.NestedSlice(m.obj.Object, "spec", "template", "spec", "containers")
		for _, c := range cs {
			if c.(map[string]any)["name"] == name {
				return c.(map[string]any)
			}
		}
	}
	return nil
}

// TestChartImageDigests: with digests set, every image the chart renders (the DaemonSet's
// containers in each of its shapes, and the socket-LB check pod) is name@digest, its tag left
// out; without, name:tag.
func TestChartImageDigests(t *testing.T) {
	ch := loadChart(t)
	cniDigest, checkDigest := "sha256:"+strings.Repeat("0123456789abcdef", 4), "sha256:"+strings.Repeat("fedcba9876543210", 4)
	digests := map[string]any{"image": map[string]any{"digest": cniDigest}, "socketLBCheck": map[string]any{"enabled": true, "imageDigest": checkDigest}}
	pinned, check := "ghcr.io/kubemesh/linkerd-cni@"+cniDigest, "ghcr.io/kubemesh/proxy-init@"+checkDigest
	for _, tc := range []struct {
		name   string
		values map[string]any
		want   map[string]string // container name -> image, every container of every pod spec
	}{
		{"digests, with the agent", digests,
			map[string]string{"install-cni": pinned, "linkerd-cni-agent": pinned, "linkerd-proxy": check}},
		{"digests, with the repair controller", merge(digests, map[string]any{"agent": map[string]any{"enabled": false}}),
			map[string]string{"install-cni": pinned, "repair-controller": pinned, "linkerd-proxy": check}},
		{"a registry with a port", merge(digests, map[string]any{"image": map[string]any{"name": "registry.example:5000/linkerd-cni"},
			"socketLBCheck": map[string]any{"image": "registry.example:5000/proxy-init:v0.1.0"}}),
			map[string]string{"install-cni": "registry.example:5000/linkerd-cni@" + cniDigest, "linkerd-cni-agent": "registry.example:5000/linkerd-cni@" + cniDigest,
				"linkerd-proxy": "registry.example:5000/proxy-init@" + checkDigest}},
		{"no digests", map[string]any{"socketLBCheck": map[string]any{"enabled": true}},
			map[string]string{"install-cni": "ghcr.io/kubemesh/linkerd-cni:v0.1.0", "linkerd-cni-agent": "ghcr.io/kubemesh/linkerd-cni:v0.1.0",
				"linkerd-proxy": "ghcr.io/kubemesh/proxy-init:v0.1.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := map[string]string{}
			for _, m := range renderChart(t, ch, tc.values) {
				spec := []string{"spec"}
				if m.obj.GetKind() == "DaemonSet" {
					spec = []string{"spec", "template", "spec"}
				}
				for _, field := range []string{"initContainers", "containers"} {
					cs, _, _ := unstructured.NestedSlice(m.obj.Object, append(spec, field)...)
					for _, c := range cs {
						got[c.(map[string]any)["name"].(string)] = c.(map[string]any)["image"].(string)
					}
				}
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("images (-want +got):\n%s", d)
			}
		})
	}
}

// TestChartRefusesBadValues: bad values fail at render time (values.schema.json, or the chart's
// own checks) with a message naming the key and the value, and render nothing.
func TestChartRefusesBadValues(t *testing.T) {
	ch := loadChart(t)
	tests := []struct {
		name   string
		values map[string]any
		want   []string // substrings of the error
	}{
		{"port above 65535", map[string]any{"inboundProxyPort": 70000}, []string{"at '/inboundProxyPort': maximum: got 70,000, want 65,535"}},
		{"port 0", map[string]any{"proxyAdminPort": 0}, []string{"proxyAdminPort", "0"}},
		{"unknown iptablesMode", map[string]any{"iptablesMode": "fast"}, []string{"at '/iptablesMode': 'fast' does not match pattern '^(nft|legacy|plain|nftables|auto)$'"}},
		{"port list with a bad port", map[string]any{"ignoreInboundPorts": "80,70000"}, []string{"ignoreInboundPorts", "80,70000"}},
		{"unknown distribution", map[string]any{"distribution": "eks"}, []string{"distribution", "eks"}},
		{"SELinux type with a colon", map[string]any{"seLinuxType": "spc_t:s0"}, []string{"at '/seLinuxType': 'spc_t:s0' does not match pattern '^[a-z0-9_]*$'"}},
		{"socket-LB check in a namespace the plugin leaves alone", map[string]any{"socketLBCheck": map[string]any{"enabled": true, "namespace": "linkerd-cni"}},
			[]string{`socketLBCheck.namespace "linkerd-cni": the plugin leaves that namespace's pods alone`}},
		{"standaloneConf not a .conf", map[string]any{"standaloneConf": "multus/linkerd-cni.conflist"}, []string{"standaloneConf", "multus/linkerd-cni.conflist"}},
		{"relative directory", map[string]any{"destCNINetDir": "etc/cni"}, []string{"destCNINetDir", "etc/cni"}},
		{"relative kubelet root dir", map[string]any{"kubeletRootDir": "var/lib/kubelet"}, []string{"kubeletRootDir", "var/lib/kubelet"}},
		{"proxy UID 0", map[string]any{"proxyUID": 0}, []string{"proxyUID", "0"}},
		{"Linkerd's image", valuesFile(t, "linkerd-2.20-defaults.yaml"),
			[]string{`image.name "cr.l5d.io/linkerd/cni-plugin" is Linkerd's image, which does not hold this chart's programs`}},
		{"image digest without its algorithm", map[string]any{"image": map[string]any{"digest": strings.Repeat("ab", 32)}},
			[]string{"at '/image/digest': '" + strings.Repeat("ab", 32) + "' does not match pattern '^$|^sha256:[0-9a-f]{64}$'"}},
		{"image digest in upper case", map[string]any{"socketLBCheck": map[string]any{"imageDigest": "sha256:" + strings.Repeat("AB", 32)}},
			[]string{"at '/socketLBCheck/imageDigest': 'sha256:" + strings.Repeat("AB", 32) + "' does not match pattern '^$|^sha256:[0-9a-f]{64}$'"}},
		{"PodSecurityPolicy", map[string]any{"enablePSP": true}, []string{"enablePSP true: PodSecurityPolicy was removed in Kubernetes 1.25"}},
		{"shared admin address", map[string]any{"agent": map[string]any{"enabled": false}, "repairController": map[string]any{"adminAddr": "127.0.0.1:9992"}},
			[]string{`installer.adminAddr and repairController.adminAddr are both "127.0.0.1:9992"`}},
		{"the agent on the installer's address", map[string]any{"agent": map[string]any{"adminAddr": "127.0.0.1:9992"}},
			[]string{`installer.adminAddr and agent.adminAddr are both "127.0.0.1:9992"`}},
		{"unknown agent mode", map[string]any{"agent": map[string]any{"mode": "heal"}}, []string{"at '/agent/mode': 'heal' does not match pattern '^(repair|delete|report)$'"}},
		{"agent audit period not a duration", map[string]any{"agent": map[string]any{"auditPeriod": "often"}}, []string{"/agent/auditPeriod", "often"}},
		{"agent CRI socket not absolute", map[string]any{"agent": map[string]any{"criSocket": "run/containerd.sock"}}, []string{"/agent/criSocket", "run/containerd.sock"}},
		{"validatorRestart not a boolean", map[string]any{"validatorRestart": map[string]any{"enabled": "yes"}},
			[]string{"at '/validatorRestart/enabled': got string, want boolean"}},
		{"a PodMonitor for a loopback address", map[string]any{"agent": map[string]any{"podMonitor": map[string]any{"enabled": true}}},
			[]string{`agent.podMonitor.enabled: Prometheus cannot scrape agent.adminAddr "127.0.0.1:9993", which is the node's loopback`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			files, err := helmchart.Render(ch, tc.values)
			if err == nil {
				t.Fatalf("rendered %d files, want an error", len(files))
			}
			if files != nil {
				t.Errorf("an error and %d files", len(files))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

// TestHelmLint runs helm's linter (what `helm lint --strict` runs) on the chart, with its
// defaults and with each rendering's values: no warning, no error.
func TestHelmLint(t *testing.T) {
	chartDir := filepath.Join(filepath.Dir(deployDir(t)), helmchart.ChartDir)
	kv, err := chartutil.ParseKubeVersion(helmchart.KubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]map[string]any{"chart defaults": {}}
	for _, r := range renderings(t) {
		if r.values != nil {
			cases[r.name] = r.values
		}
	}
	for name, values := range cases {
		t.Run(name, func(t *testing.T) {
			res := lint.AllWithKubeVersion(chartDir, values, helmchart.Namespace, kv)
			for _, m := range res.Messages {
				if m.Severity > support.InfoSev {
					t.Errorf("helm lint: %s", m)
				}
			}
		})
	}
	// The linter does judge: a value the schema refuses is an error.
	res := lint.AllWithKubeVersion(chartDir, map[string]any{"iptablesMode": "fast"}, helmchart.Namespace, kv)
	if res.HighestSeverity != support.ErrorSev {
		t.Errorf("helm lint with iptablesMode fast: highest severity %d, want an error; messages %v", res.HighestSeverity, res.Messages)
	}
}

// The socket-LB check pod (socketLBCheck.enabled): a `helm test` hook, meshed in the plugin's
// eyes, running the validator against the kubernetes Service as the pod sees it; the arguments,
// once the kubelet has expanded them, are ones the validator accepts.
func TestSocketLBCheckPod(t *testing.T) {
	ms := renderChart(t, loadChart(t), map[string]any{"socketLBCheck": map[string]any{"enabled": true}})
	var pod *unstructured.Unstructured
	for _, m := range ms {
		if m.obj.GetKind() == "Pod" {
			pod = m.obj
		}
	}
	if pod == nil {
		t.Fatal("no Pod rendered")
	}
	if pod.GetAnnotations()["helm.sh/hook"] != "test" || pod.GetNamespace() != "default" {
		t.Errorf("pod %s/%s annotations %v: want a helm test in default", pod.GetNamespace(), pod.GetName(), pod.GetAnnotations())
	}
	var spec cniplugin.PodSpec
	raw, _ := json.Marshal(pod.Object["spec"])
	if err := json.Unmarshal(raw, &spec); err != nil {
		t.Fatal(err)
	}
	if k := cniplugin.Classify(&spec); !k.NeedsRules() {
		t.Errorf("the plugin classifies the check pod %s: it would write no rules", k)
	}
	containers, _, _ := unstructured.NestedSlice(pod.Object, "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(containers[0].(map[string]any), "args")
	if !slices.Contains(args, "--connect-addr=$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)") {
		t.Errorf("args %q do not dial the kubernetes Service", args)
	}
	expanded := strings.NewReplacer("$(KUBERNETES_SERVICE_HOST)", "10.96.0.1", "$(KUBERNETES_SERVICE_PORT)", "443")
	for i := range args {
		args[i] = expanded.Replace(args[i])
	}
	c, err := validator.Parse(args)
	if err != nil || c.ConnectAddr != "10.96.0.1:443" || c.ListenAddr != "0.0.0.0:4140" {
		t.Errorf("validator.Parse(%q) = %+v, %v", args, c, err)
	}
}

// TestChartPodMonitor: the agent's PodMonitor renders only when asked for and the cluster has the
// Prometheus operator's CRD; it scrapes the port the agent container declares, on the address
// the agent serves /metrics on.
func TestChartPodMonitor(t *testing.T) {
	ch := loadChart(t)
	const crd = "monitoring.coreos.com/v1/PodMonitor"
	on := map[string]any{"agent": map[string]any{"adminAddr": "0.0.0.0:9993", "podMonitor": map[string]any{"enabled": true, "labels": map[string]any{"release": "prom"}}}}
	for _, tc := range []struct {
		name   string
		values map[string]any
		apis   []string
		want   bool
	}{
		{"default, with the CRD", nil, []string{crd}, false},
		{"enabled, without the CRD", on, nil, false},
		{"enabled, with the CRD", on, []string{crd}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			files, err := helmchart.RenderWithAPIs(ch, tc.values, tc.apis...)
			if err != nil {
				t.Fatal(err)
			}
			pm, ok := files["40-podmonitor.yaml"]
			if ok != tc.want {
				t.Fatalf("PodMonitor rendered: %v, want %v", ok, tc.want)
			}
			if !ok {
				return
			}
			var obj struct {
				Kind     string
				Metadata struct{ Labels map[string]string }
				Spec     struct {
					Selector            struct{ MatchLabels map[string]string }
					PodMetricsEndpoints []struct{ Port, Path, Interval string }
				}
			}
			if err := sigsyaml.Unmarshal([]byte(pm), &obj); err != nil {
				t.Fatal(err)
			}
			ep := obj.Spec.PodMetricsEndpoints
			if obj.Kind != "PodMonitor" || obj.Metadata.Labels["release"] != "prom" || obj.Spec.Selector.MatchLabels["k8s-app"] != "linkerd-cni" ||
				len(ep) != 1 || ep[0].Port != "agent-admin" || ep[0].Path != "/metrics" || ep[0].Interval != "30s" {
				t.Errorf("PodMonitor:\n%s", pm)
			}
			ports, _, _ := unstructured.NestedSlice(container(t, parseManifests(t, "30-daemonset.yaml", []byte(files["30-daemonset.yaml"])), "linkerd-cni-agent"), "ports")
			if len(ports) != 1 || ports[0].(map[string]any)["name"] != "agent-admin" || ports[0].(map[string]any)["containerPort"] != int64(9993) {
				t.Errorf("the agent's ports %v, want agent-admin 9993", ports)
			}
		})
	}
}
