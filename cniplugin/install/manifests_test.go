package install

// Tests of deploy/ against a real kube-apiserver and etcd (test/kubetest): every object
// passes server-side dry-run apply, the workloads pass Pod Security admission at the level their
// namespace declares (and are refused where they should be), and the linkerd-cni ServiceAccount
// can do exactly what the ClusterRole says.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"sigs.k8s.io/yaml"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/cniplugin/repair"
	"github.com/kubemesh/proxy-init/test/kubetest"
)

const fieldManager = "kubemesh-manifest-test"

// deployDir is the repository's deploy/ directory.
func deployDir(t testing.TB) string {
	t.Helper()
	d, err := filepath.Abs("../../deploy")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// manifest is one object of one file.
type manifest struct {
	file string
	obj  *unstructured.Unstructured
}

func (m manifest) String() string {
	return filepath.Base(m.file) + ": " + m.obj.GetKind() + " " + m.obj.GetNamespace() + "/" + m.obj.GetName()
}

// loadManifests reads every YAML document of every *.yaml file under dirs.
func loadManifests(t testing.TB, dirs ...string) []manifest {
	t.Helper()
	var out []manifest
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(files)
		if len(files) == 0 {
			t.Fatalf("no manifests in %s", dir)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, parseManifests(t, f, data)...)
		}
	}
	return out
}

// parseManifests reads every YAML document of data, the content of file.
func parseManifests(t testing.TB, file string, data []byte) []manifest {
	t.Helper()
	var out []manifest
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		js, err := yaml.YAMLToJSON(doc)
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if s := strings.TrimSpace(string(js)); s == "null" || s == "{}" {
			continue // an empty document
		}
		// UnmarshalJSON keeps integers as int64, as the API machinery expects.
		obj := &unstructured.Unstructured{}
		if err := obj.UnmarshalJSON(js); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		out = append(out, manifest{file: file, obj: obj})
	}
}

// apiClient bundles what the tests use to talk to the API server.
type apiClient struct {
	dyn    dynamic.Interface
	mapper meta.RESTMapper
	cs     kubernetes.Interface

	mu       sync.Mutex
	warnings []string
}

func (c *apiClient) HandleWarningHeader(_ int, _ string, text string) {
	c.mu.Lock()
	c.warnings = append(c.warnings, text)
	c.mu.Unlock()
}

func (c *apiClient) takeWarnings() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.warnings
	c.warnings = nil
	return w
}

func newAPIClient(t testing.TB, cfg *rest.Config) *apiClient {
	t.Helper()
	c := &apiClient{}
	cfg = rest.CopyConfig(cfg)
	cfg.WarningHandler = c
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	if c.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	if c.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	return c
}

// apply server-side applies obj, as `kubectl apply --server-side` does; dryRun adds
// ?dryRun=All, so the server runs defaulting, validation and admission but stores nothing.
func (c *apiClient) apply(ctx context.Context, obj *unstructured.Unstructured, dryRun bool) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, err
	}
	opts := metav1.ApplyOptions{FieldManager: fieldManager, Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	var ri dynamic.ResourceInterface = c.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		ri = c.dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
	}
	return ri.Apply(ctx, obj.GetName(), obj, opts)
}

// podFrom turns a workload's pod template into a Pod in namespace, so that Pod Security
// admission, which only enforces on pods, judges it.
func podFrom(t testing.TB, m manifest, namespace string) *corev1.Pod {
	t.Helper()
	tmpl, found, err := unstructured.NestedMap(m.obj.Object, "spec", "template")
	if err != nil || !found {
		t.Fatalf("%s has no pod template", m)
	}
	var pt corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmpl, &pt); err != nil {
		t.Fatalf("%s: %v", m, err)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: strings.ToLower(m.obj.GetName()) + "-pod", Namespace: namespace, Labels: pt.Labels, Annotations: pt.Annotations},
		Spec:       pt.Spec,
	}
}

func dryRunPod(ctx context.Context, cs kubernetes.Interface, pod *corev1.Pod) error {
	_, err := cs.CoreV1().Pods(pod.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err
}

// TestManifestContract checks every rendering without a cluster: the names `linkerd check` looks
// for, the default ConfigMap against Linkerd's JSON, the node's directories, and that the
// DaemonSet uses only installer variables, with hardened containers.
func TestManifestContract(t *testing.T) {
	for _, r := range renderings(t) {
		t.Run(r.name, func(t *testing.T) { checkContract(t, r) })
	}
}

func checkContract(t *testing.T, r rendering) {
	ms := r.ms
	find := func(kind, name string) *unstructured.Unstructured {
		t.Helper()
		for _, m := range ms {
			if m.obj.GetKind() == kind && m.obj.GetName() == name {
				return m.obj
			}
		}
		t.Fatalf("rendering %s has no %s %q", r.name, kind, name)
		return nil
	}
	ns := find("Namespace", "linkerd-cni")
	for k, v := range map[string]string{"linkerd.io/cni-resource": "true", "pod-security.kubernetes.io/enforce": "privileged"} {
		if ns.GetLabels()[k] != v {
			t.Errorf("Namespace label %s = %q, want %q", k, ns.GetLabels()[k], v)
		}
	}
	for _, kind := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet"} {
		find(kind, "linkerd-cni")
	}
	cm := find("ConfigMap", "linkerd-cni-config")
	got, _, _ := unstructured.NestedString(cm.Object, "data", "cni_network_config")
	var a, b any
	if err := json.Unmarshal([]byte(got), &a); err != nil {
		t.Fatalf("cni_network_config is not JSON: %v", err)
	}
	// Other renderings are compared by meaning (TestChartConfigMeansWhatLinkerdsDoes).
	_ = json.Unmarshal([]byte(DefaultNetworkConfig), &b)
	if ja, jb := mustJSON(a), mustJSON(b); r.values == nil && ja != jb {
		t.Errorf("cni_network_config differs from Linkerd's default (DefaultNetworkConfig):\n got %s\nwant %s", ja, jb)
	}

	ds := find("DaemonSet", "linkerd-cni")
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	var install map[string]any
	for _, c := range containers {
		if c.(map[string]any)["name"] == "install-cni" {
			install = c.(map[string]any)
		}
	}
	if install == nil {
		t.Fatal("DaemonSet has no install-cni container")
	}
	known := map[string]bool{}
	for _, k := range []string{"DEST_CNI_NET_DIR", "DEST_CNI_BIN_DIR", "CNI_NETWORK_CONFIG", "CNI_NETWORK_CONFIG_FILE",
		"CONTAINER_MOUNT_PREFIX", "CONTAINER_CNI_BIN_DIR", "KUBECONFIG_FILE_NAME", "KUBE_CA_FILE", "POD_NAMESPACE", "POD_NAME",
		"KUBERNETES_NODE_NAME", "SERVICE_ACCOUNT_PATH", "SKIP_TLS_VERIFY", "CNI_MTU", EnvStandaloneConf} {
		known[k] = true
	}
	env, _, _ := unstructured.NestedSlice(install, "env")
	standalone := ""
	for _, e := range env {
		e := e.(map[string]any)
		n := e["name"].(string)
		if !known[n] {
			t.Errorf("install-cni sets %s, which the installer does not read", n)
		}
		if want := map[string]string{"DEST_CNI_NET_DIR": r.netDir, "DEST_CNI_BIN_DIR": r.binDir}[n]; want != "" && e["value"] != want {
			t.Errorf("install-cni %s = %v, want %s", n, e["value"], want)
		}
		if n == EnvStandaloneConf {
			standalone, _ = e["value"].(string)
		}
	}
	if standalone != r.standalone {
		t.Errorf("install-cni %s = %q, want %q", EnvStandaloneConf, standalone, r.standalone)
	}
	// The node's directories are mounted under the prefix, from hostPath volumes of the same
	// paths.
	mounts, _, _ := unstructured.NestedSlice(install, "volumeMounts")
	volumes, _, _ := unstructured.NestedSlice(find("DaemonSet", "linkerd-cni").Object, "spec", "template", "spec", "volumes")
	for _, dir := range []string{r.netDir, r.binDir} {
		var vol string
		for _, m := range mounts {
			if m := m.(map[string]any); m["mountPath"] == "/host"+dir {
				vol = m["name"].(string)
			}
		}
		var hostPath string
		for _, v := range volumes {
			if v := v.(map[string]any); v["name"] == vol {
				hostPath, _, _ = unstructured.NestedString(v, "hostPath", "path")
			}
		}
		if vol == "" || hostPath != dir {
			t.Errorf("node directory %s: mounted from volume %q at /host%s, hostPath %q", dir, vol, dir, hostPath)
		}
	}
	cmd, _, _ := unstructured.NestedStringSlice(install, "command")
	args, _, _ := unstructured.NestedStringSlice(install, "args")
	if !slices.Equal(cmd, []string{"/usr/local/bin/linkerd-cni", "install"}) {
		t.Errorf("install-cni command = %q", cmd)
	}
	// The flags must parse, and the probes must hit the admin address they set.
	if code := mainWith(append(slices.Clone(args), "--help"), func(string) string { return "" }, io.Discard); code != 0 {
		t.Errorf("install-cni args %q do not parse (exit %d)", args, code)
	}
	for _, probe := range []string{"readinessProbe", "livenessProbe"} {
		port, _, _ := unstructured.NestedInt64(install, probe, "httpGet", "port")
		host, _, _ := unstructured.NestedString(install, probe, "httpGet", "host")
		if !slices.Contains(args, "--admin-addr="+host+":"+itoa(port)) {
			t.Errorf("%s hits %s:%d, which --admin-addr in %q does not serve", probe, host, port, args)
		}
	}
	pre, _, _ := unstructured.NestedStringSlice(install, "lifecycle", "preStop", "exec", "command")
	if !slices.Equal(pre, []string{"/usr/local/bin/linkerd-cni", "install", "--pre-stop"}) {
		t.Errorf("preStop = %q", pre)
	}

	byName := map[string]map[string]any{}
	for _, c := range containers {
		byName[c.(map[string]any)["name"].(string)] = c.(map[string]any)
	}
	agentC, rc := byName["linkerd-cni-agent"], byName["repair-controller"]
	if (agentC != nil) != (r.second == "agent") || (rc != nil) != (r.second == "repair") || len(containers) != map[bool]int{true: 2, false: 1}[r.second != ""] {
		t.Fatalf("containers %v, want install-cni and %q", slices.Collect(maps.Keys(byName)), r.second)
	}
	checkHardened(t, containers, r)
	if agentC != nil {
		checkAgent(t, r, agentC, args, volumes)
	}
	if rc == nil {
		return
	}
	// The repair controller: its command, its node from the downward API, its flags, and
	// probes on its own loopback admin port.
	if cmd, _, _ := unstructured.NestedStringSlice(rc, "command"); !slices.Equal(cmd, []string{"/usr/local/bin/linkerd-cni", "repair"}) {
		t.Errorf("repair-controller command = %q", cmd)
	}
	if from := fieldRefs(rc); !maps.Equal(from, map[string]string{repair.EnvNodeName: "spec.nodeName", repair.EnvPodName: "metadata.name"}) {
		t.Errorf("repair-controller environment from %v", from)
	}
	rcArgs, _, _ := unstructured.NestedStringSlice(rc, "args")
	rcCfg, err := repair.ParseArgs(rcArgs, func(k string) string {
		if k == repair.EnvNodeName {
			return "node-1"
		}
		return ""
	})
	if err != nil {
		t.Errorf("repair-controller args %q: %v", rcArgs, err)
	}
	checkAdmin(t, "repair-controller", rc, rcCfg.AdminAddr, args)
	if rcSC, _, _ := unstructured.NestedMap(rc, "securityContext"); rcSC["runAsNonRoot"] != true {
		t.Errorf("repair-controller runs as root: %v", rcSC)
	}
}

// fieldRefs maps a container's variables to the downward API fields they come from.
func fieldRefs(c map[string]any) map[string]string {
	env, _, _ := unstructured.NestedSlice(c, "env")
	from := map[string]string{}
	for _, e := range env {
		e := e.(map[string]any)
		from[e["name"].(string)], _, _ = unstructured.NestedString(e, "valueFrom", "fieldRef", "fieldPath")
	}
	return from
}

// checkAdmin: the container's admin address is on loopback (the pod uses the host network), not
// the installer's, and its probes hit it.
func checkAdmin(t *testing.T, name string, c map[string]any, addr string, installArgs []string) {
	t.Helper()
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("%s --admin-addr %q is not on loopback (the pod uses the host network)", name, addr)
	}
	if slices.Contains(installArgs, "--admin-addr="+addr) {
		t.Errorf("installer and %s share the admin address %s", name, addr)
	}
	for _, probe := range []struct{ name, path string }{{"readinessProbe", "/ready"}, {"livenessProbe", "/live"}} {
		port, _, _ := unstructured.NestedInt64(c, probe.name, "httpGet", "port")
		host, _, _ := unstructured.NestedString(c, probe.name, "httpGet", "host")
		path, _, _ := unstructured.NestedString(c, probe.name, "httpGet", "path")
		if host+":"+itoa(port) != addr || path != probe.path {
			t.Errorf("%s %s hits %s:%d%s, want %s%s", name, probe.name, host, port, path, addr, probe.path)
		}
	}
}

// checkAgent: the agent's command and flags parse; its socket is the plugin's default path, in a
// hostPath directory of the same path; it polls the installer's /ready; what it audits through (the CRI socket itself, not the
// runtime's state directory; the node's /proc; the CNI config directory; read-only but /proc) is
// mounted from the node where its flags say.
func checkAgent(t *testing.T, r rendering, c map[string]any, installArgs []string, volumes []any) {
	t.Helper()
	if cmd, _, _ := unstructured.NestedStringSlice(c, "command"); !slices.Equal(cmd, []string{"/usr/local/bin/linkerd-cni", "agent"}) {
		t.Errorf("agent command = %q", cmd)
	}
	if from := fieldRefs(c); !maps.Equal(from, map[string]string{agent.EnvNodeName: "spec.nodeName", agent.EnvPodName: "metadata.name"}) {
		t.Errorf("agent environment from %v", from)
	}
	argv, _, _ := unstructured.NestedStringSlice(c, "args")
	cfg, err := agent.ParseArgs(argv, func(k string) string { return map[string]string{agent.EnvNodeName: "node-1"}[k] })
	if err != nil {
		t.Fatalf("agent args %q: %v", argv, err)
	}
	checkAdmin(t, "agent", c, cfg.AdminAddr, installArgs)
	if (cfg.Socket != "") == r.noLookups || (cfg.AuditPeriod > 0) == r.noAudits || cfg.PIDFallback != r.pidFallback {
		t.Errorf("agent --socket %q, --audit-period %s, --pid-fallback %t; want lookups %t, audits %t, PID fallback %t",
			cfg.Socket, cfg.AuditPeriod, cfg.PIDFallback, !r.noLookups, !r.noAudits, r.pidFallback)
	}
	if cfg.Socket != "" && cfg.Socket != cniplugin.DefaultAgentSocket {
		t.Errorf("agent --socket %q, but the plugin asks %s", cfg.Socket, cniplugin.DefaultAgentSocket)
	}
	for _, arg := range installArgs {
		if addr, ok := strings.CutPrefix(arg, "--admin-addr="); ok && cfg.InstallerReadyURL != "http://"+addr+"/ready" {
			t.Errorf("agent --installer-ready-url %q, but the installer serves /ready on %s", cfg.InstallerReadyURL, addr)
		}
	}
	mounts, _, _ := unstructured.NestedSlice(c, "volumeMounts")
	hostPaths, types := map[string]string{}, map[string]string{}
	for _, v := range volumes {
		v := v.(map[string]any)
		hostPaths[v["name"].(string)], _, _ = unstructured.NestedString(v, "hostPath", "path")
		types[v["name"].(string)], _, _ = unstructured.NestedString(v, "hostPath", "type")
	}
	mounted := map[string][3]string{} // mount path -> host path, read-only, propagation
	for _, m := range mounts {
		m := m.(map[string]any)
		ro := "rw"
		if m["readOnly"] == true {
			ro = "ro"
		}
		prop, _ := m["mountPropagation"].(string)
		mounted[m["mountPath"].(string)] = [3]string{hostPaths[m["name"].(string)], ro, prop}
	}
	// Nothing is mounted read-write but the plugin's state directory, at the node's path (the
	// socket; the lock files and records audits use as the plugin does); the node's /proc only
	// for the socket's peer check and the PID fallback.
	want := map[string][3]string{}
	if !r.noLookups || !r.noAudits {
		want[cniplugin.DefaultStateDir] = [3]string{cniplugin.DefaultStateDir, "rw", ""}
	}
	if cfg.Socket != "" && filepath.Dir(cfg.Socket) != cniplugin.DefaultStateDir {
		t.Errorf("agent --socket %s is not in the state directory %s", cfg.Socket, cniplugin.DefaultStateDir)
	}
	if !r.noLookups || r.pidFallback {
		want[cfg.HostProc] = [3]string{"/proc", "ro", ""}
	}
	// The kubelet's pods API, for lookups only: its directory alone, read-only.
	if !r.noLookups {
		if cfg.KubeletPodsSocket != agent.DefaultKubeletPodsSocket {
			t.Errorf("agent --kubelet-pods-socket %q, want %s", cfg.KubeletPodsSocket, agent.DefaultKubeletPodsSocket)
		}
		want[filepath.Dir(cfg.KubeletPodsSocket)] = [3]string{"/var/lib/kubelet/pods-api", "ro", ""}
	}
	cri := strings.TrimPrefix(cfg.CRI, "unix://")
	if !r.noAudits {
		want[cri] = [3]string{strings.TrimPrefix(cri, "/host"), "ro", ""}
		want[cfg.NetNSDir] = [3]string{"/var/run/netns", "ro", "HostToContainer"}
		want[cfg.CNINetDir] = [3]string{r.netDir, "ro", ""}
		if "/host"+r.netDir != cfg.CNINetDir || cfg.NetNSDir != "/var/run/netns" {
			t.Errorf("agent --cni-net-dir %s, --netns-dir %s; want /host%s, /var/run/netns", cfg.CNINetDir, cfg.NetNSDir, r.netDir)
		}
		// A missing socket must not keep the pod from starting.
		if types["cri-socket"] != "" {
			t.Errorf("the CRI socket's hostPath has type %q, want none", types["cri-socket"])
		}
	}
	if !maps.Equal(mounted, want) {
		t.Errorf("agent mounts %v, want %v", mounted, want)
	}
	distCRI := map[string]string{
		"k3s": "unix:///host/run/k3s/containerd/containerd.sock", "k3s-custom-cni": "unix:///host/run/k3s/containerd/containerd.sock",
		"rke2": "unix:///host/run/k3s/containerd/containerd.sock", "microk8s": "unix:///host/var/snap/microk8s/common/run/containerd.sock",
		"openshift": "unix:///host/var/run/crio/crio.sock", "gke": "unix:///host/run/containerd/containerd.sock",
	}
	if want, ok := distCRI[r.name]; ok && cfg.CRI != want {
		t.Errorf("%s: --cri-socket %s is not the distribution's, %s", r.name, cfg.CRI, want)
	}
}

// checkHardened: every container drops every capability, cannot escalate, has a read-only root
// and RuntimeDefault seccomp; only the agent adds capabilities, exactly those its audits need
// (write rules, enter a namespace; open another user's /proc/<pid>/ns/net only with the PID
// fallback), and none for lookups alone, which the plugin writes; install-cni and the
// agent are privileged only where the rendering asks for it (and then may not forbid escalation,
// which the API refuses with privileged).
func checkHardened(t *testing.T, containers []any, r rendering) {
	t.Helper()
	for _, c := range containers {
		c := c.(map[string]any)
		sc, _, _ := unstructured.NestedMap(c, "securityContext")
		drop, _, _ := unstructured.NestedStringSlice(sc, "capabilities", "drop")
		add, _, _ := unstructured.NestedStringSlice(sc, "capabilities", "add")
		seccomp, _, _ := unstructured.NestedString(sc, "seccompProfile", "type")
		priv := r.privileged && c["name"] != "repair-controller"
		var wantAdd []string
		if c["name"] == "linkerd-cni-agent" && !r.noAudits {
			wantAdd = []string{"NET_ADMIN", "SYS_ADMIN"}
			if r.pidFallback {
				wantAdd = append(wantAdd, "SYS_PTRACE")
			}
		}
		if sc["privileged"] != priv || (!priv && sc["allowPrivilegeEscalation"] != false) || sc["readOnlyRootFilesystem"] != true ||
			!slices.Equal(drop, []string{"ALL"}) || !slices.Equal(add, wantAdd) || seccomp != "RuntimeDefault" {
			t.Errorf("container %s: securityContext %v is not hardened (privileged %v, capabilities %v)", c["name"], sc, priv, wantAdd)
		}
		// The SELinux type, where SELinux confines containers (openshift), replaces privileged:
		// only install-cni and the agent touch the node's files, sockets and namespaces.
		wantType := r.seLinuxType
		if c["name"] == "repair-controller" {
			wantType = ""
		}
		seType, _, _ := unstructured.NestedString(sc, "seLinuxOptions", "type")
		if seLinux, _, _ := unstructured.NestedMap(sc, "seLinuxOptions"); seType != wantType || len(seLinux) > 1 {
			t.Errorf("container %s: seLinuxOptions %v, want type %q alone", c["name"], seLinux, wantType)
		}
	}
}

func itoa(i int64) string { b, _ := json.Marshal(i); return string(b) }

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestManifestsAgainstAPIServer runs every rendering (deploy/ with its optional objects and
// examples, and the chart's other renderings) through one real kube-apiserver.
func TestManifestsAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: starts kube-apiserver and etcd")
	}
	cluster := kubetest.Start(t, kubetest.Options{})
	c := newAPIClient(t, cluster.AdminConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, lvl := range []string{"baseline", "restricted"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "psa-" + lvl,
			Labels: map[string]string{"pod-security.kubernetes.io/enforce": lvl}}}
		if _, err := c.cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "rbac-node"}}
	if _, err := c.cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir := deployDir(t)
	for _, r := range renderings(t) {
		t.Run(r.name, func(t *testing.T) {
			all := r.ms
			if r.values == nil {
				all = append(slices.Clone(all), loadManifests(t, filepath.Join(dir, "linkerd-cni", "optional"), filepath.Join(dir, "examples"))...)
			}
			checkAgainstAPIServer(ctx, t, cluster, c, r, all)
		})
	}
}

func checkAgainstAPIServer(ctx context.Context, t *testing.T, cluster *kubetest.Cluster, c *apiClient, r rendering, all []manifest) {
	// Namespaces first: dry-run, then for real, since namespaced objects (and Pod Security
	// admission) need them to exist.
	var rest []manifest
	for _, m := range all {
		if m.obj.GetKind() != "Namespace" {
			rest = append(rest, m)
			continue
		}
		if _, err := c.apply(ctx, m.obj, true); err != nil {
			t.Fatalf("dry-run apply %s: %v", m, err)
		}
		if _, err := c.apply(ctx, m.obj, false); err != nil {
			t.Fatalf("apply %s: %v", m, err)
		}
	}

	t.Run("server-side dry-run apply of every object", func(t *testing.T) {
		for _, m := range rest {
			got, err := c.apply(ctx, m.obj, true)
			if err != nil {
				t.Errorf("dry-run apply %s: %v", m, err)
				continue
			}
			if got.GetUID() == "" && got.GetKind() != m.obj.GetKind() {
				t.Errorf("dry-run apply %s returned %v", m, got)
			}
			if w := c.takeWarnings(); len(w) > 0 {
				t.Errorf("dry-run apply %s: server warnings %q", m, w)
			}
			// Dry-run must store nothing.
			gvk := m.obj.GroupVersionKind()
			mp, _ := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			_, err = c.dyn.Resource(mp.Resource).Namespace(m.obj.GetNamespace()).Get(ctx, m.obj.GetName(), metav1.GetOptions{})
			if mp.Scope.Name() != meta.RESTScopeNameNamespace {
				_, err = c.dyn.Resource(mp.Resource).Get(ctx, m.obj.GetName(), metav1.GetOptions{})
			}
			if !apierrors.IsNotFound(err) {
				t.Errorf("dry-run apply of %s stored the object (get: %v)", m, err)
			}
		}
	})

	t.Run("pod security admission", func(t *testing.T) {
		workload := func(kind, file string) *manifest {
			for i := range rest {
				if _, ok, _ := unstructured.NestedMap(rest[i].obj.Object, "spec", "template"); ok &&
					(rest[i].obj.GetKind() == kind || filepath.Base(rest[i].file) == file) {
					return &rest[i]
				}
			}
			return nil
		}
		type check struct {
			kind, file string // the workload: a kind, or a file's base name
			ns         string // "" = the manifest's own namespace
			admitted   bool
		}
		checks := []check{
			{kind: "DaemonSet", admitted: true},
			{kind: "DaemonSet", ns: "psa-baseline"},
			{kind: "DaemonSet", ns: "psa-restricted"},
		}
		if r.values == nil {
			checks = append(checks,
				check{file: "proxy-init-workload.yaml", admitted: true},
				check{file: "proxy-init-workload.yaml", ns: "psa-baseline"}, // NET_ADMIN is not baseline
				check{file: "proxy-init-workload.yaml", ns: "psa-restricted"},
				check{file: "cni-workload.yaml", admitted: true}, // its namespace enforces restricted
				check{file: "cni-workload.yaml", ns: "psa-restricted", admitted: true})
		}
		for _, ck := range checks {
			m := workload(ck.kind, ck.file)
			if m == nil {
				t.Fatalf("no workload %s%s", ck.kind, ck.file)
			}
			ns := ck.ns
			if ns == "" {
				ns = m.obj.GetNamespace()
			}
			nsObj, err := c.cs.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			level := nsObj.Labels["pod-security.kubernetes.io/enforce"]
			if level == "" {
				t.Errorf("namespace %s declares no Pod Security level", ns)
			}
			err = dryRunPod(ctx, c.cs, podFrom(t, *m, ns))
			switch {
			case ck.admitted && err != nil:
				t.Errorf("%s pod refused in %s (enforce=%s): %v", m, ns, level, err)
			case !ck.admitted && err == nil:
				t.Errorf("%s pod admitted in %s (enforce=%s); Pod Security should refuse it", m, ns, level)
			case !ck.admitted && !(apierrors.IsForbidden(err) && strings.Contains(err.Error(), "violates PodSecurity")):
				t.Errorf("%s pod in %s refused for the wrong reason: %v", m, ns, err)
			default:
				t.Logf("%s in %s (enforce=%s): admitted=%v %v", m, ns, level, err == nil, err)
			}
		}
		// A DaemonSet object itself is not refused (Pod Security enforces on pods), but
		// the server warns about its template where the level forbids it.
		moved := workload("DaemonSet", "").obj.DeepCopy()
		moved.SetNamespace("psa-restricted")
		c.takeWarnings()
		if _, err := c.apply(ctx, moved, true); err != nil {
			t.Fatalf("dry-run DaemonSet into psa-restricted: %v", err)
		}
		if w := strings.Join(c.takeWarnings(), "\n"); !strings.Contains(w, "would violate PodSecurity") || !strings.Contains(w, "hostNetwork") {
			t.Errorf("no Pod Security warning for the DaemonSet in a restricted namespace; warnings: %q", w)
		}
	})

	t.Run("linkerd-cni service account permissions", func(t *testing.T) {
		checkPermissions(ctx, t, cluster, c, r, rest)
	})
}
