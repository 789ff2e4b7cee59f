package cniplugin_test

// The integration harness: an isolated "node" network namespace holding a real kube-apiserver and
// etcd, the real bridge, host-local and loopback plugins, and the linkerd-cni binary built from
// this checkout, all driven by libcni as containerd drives them. Nothing is linked to the
// machine's root network namespace: the bridge, the veths and every address live in namespaces
// the test created.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/cnitest"
	"github.com/kubemesh/proxy-init/test/kubetest"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

const (
	// The node's pod network; the bridge (cni0) is its gateway.
	podSubnet = "203.0.113.0/24"
	gatewayIP = "203.0.113.1"

	cniNamespace      = "linkerd-cni"
	cniServiceAccount = "linkerd-cni"
	// nodeName is the node every test pod is bound to (the node agent watches its pods).
	nodeName = "cni-node"
)

// ---- binaries ----

var (
	binOnce sync.Once
	binDirs []string
	binErr  error
	ownDir  string // this test binary's own builds; removed by TestMain
)

func TestMain(m *testing.M) {
	code := m.Run()
	if ownDir != "" {
		_ = os.RemoveAll(ownDir)
	}
	os.Exit(code)
}

// pluginBinaries returns the directories libcni searches: the real containernetworking plugins
// (built once per pinned version into a cache outside the repository, $CNI_PLUGINS_CACHE or
// /var/cache/proxy-init-cni) and this checkout's linkerd-cni and noopcni (built for this test
// binary; the go build cache makes that a link step).
func pluginBinaries(t testing.TB) []string {
	t.Helper()
	binOnce.Do(func() { binDirs, binErr = buildBinaries() })
	if binErr != nil {
		t.Fatalf("build CNI plugins: %v", binErr)
	}
	return binDirs
}

func buildBinaries() ([]string, error) {
	plugins, err := cnitest.PluginsDir()
	if err != nil {
		return nil, err
	}
	ownDir, err = os.MkdirTemp("", "linkerd-cni-test-bin-")
	if err != nil {
		return nil, err
	}
	// linkerd-cni as the node runs it (the tag means nothing to noopcni).
	if err := cnitest.GoBuild(ownDir, append(cnitest.NodeBinaries, "github.com/kubemesh/proxy-init/test/noopcni")...); err != nil {
		return nil, err
	}
	return []string{ownDir, plugins}, nil
}

// ---- the node ----

// node is one simulated Kubernetes node: its network namespace, its API server, and the CNI
// configuration a runtime on it would use.
type node struct {
	ns         *netnstest.NS
	kube       *kubetest.Cluster
	dir        string
	kubeconfig string // the linkerd-cni service account's kubeconfig, as the installer writes it
	logFile    string // the plugin's log_file
	cni        *libcni.CNIConfig
	ids        atomic.Int64
}

// newNode creates the node namespace and the CNI runtime; with withAPI it also starts the API
// server inside it and writes the plugin's kubeconfig, as the installer would.
func newNode(t testing.TB, withAPI bool) *node {
	t.Helper()
	if testing.Short() {
		t.Skip("integration test (node netns, CNI plugins, kube-apiserver): skipped with -short")
	}
	netnstest.RequireRoot(t)
	dirs := pluginBinaries(t)
	n := &node{dir: t.TempDir()}
	n.ns = netnstest.NewNS(t)
	n.kubeconfig = filepath.Join(n.dir, "ZZZ-linkerd-cni-kubeconfig")
	if withAPI {
		n.startAPI(t)
	}
	n.logFile = filepath.Join(n.dir, "linkerd-cni.log")
	stderr, err := os.Create(filepath.Join(n.dir, "plugins.stderr"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stderr.Close() })
	if err := os.MkdirAll(filepath.Join(n.dir, "ipam"), 0o755); err != nil {
		t.Fatal(err)
	}
	n.cni = libcni.NewCNIConfigWithCacheDir(dirs, filepath.Join(n.dir, "cache"), &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: stderr}})
	return n
}

func (n *node) startAPI(t testing.TB) {
	t.Helper()
	n.kube = kubetest.Start(t, kubetest.Options{NetNSPath: n.ns.Path()})
	ctx := context.Background()
	cs := n.kube.Clientset
	mustCreate(t, "namespace", func() error {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cniNamespace}}, metav1.CreateOptions{})
		return err
	})
	// The permissions of Linkerd's linkerd-cni ClusterRole that the plugin uses.
	mustCreate(t, "clusterrole", func() error {
		_, err := cs.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "linkerd-cni"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods", "nodes", "namespaces", "services"},
				Verbs: []string{"list", "get", "watch"}}},
		}, metav1.CreateOptions{})
		return err
	})
	token := n.serviceAccountToken(t, cniServiceAccount)
	if err := n.kube.WriteKubeconfig(n.kubeconfig, token); err != nil {
		t.Fatal(err)
	}
}

// serviceAccountToken creates a service account in linkerd-cni bound to the linkerd-cni
// ClusterRole and returns a token for it.
func (n *node) serviceAccountToken(t testing.TB, name string) string {
	t.Helper()
	token, err := n.kube.ServiceAccountToken(context.Background(), cniNamespace, name, "linkerd-cni", nil)
	if err != nil {
		t.Fatal(err)
	}
	return token
}

func mustCreate(t testing.TB, what string, f func() error) {
	t.Helper()
	if err := f(); err != nil {
		t.Fatalf("create %s: %v", what, err)
	}
}

func (n *node) createNamespace(t testing.TB, name string, annotations map[string]string) {
	t.Helper()
	mustCreate(t, "namespace "+name, func() error {
		_, err := n.kube.Clientset.CoreV1().Namespaces().Create(context.Background(),
			&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations}}, metav1.CreateOptions{})
		return err
	})
}

// podShape is how a test pod is built.
type podShape string

const (
	shapeClassic     podShape = "classic"      // app + linkerd-proxy containers
	shapeNative      podShape = "native"       // linkerd-proxy init container with restartPolicy Always
	shapeLinkerdInit podShape = "linkerd-init" // linkerd-init init container + linkerd-proxy
	shapeUnmeshed    podShape = "unmeshed"     // app only
)

func (n *node) createPod(t testing.TB, namespace, name string, shape podShape, labels, annotations map[string]string) {
	t.Helper()
	c := func(name string) corev1.Container {
		return corev1.Container{Name: name, Image: "registry.invalid/" + name + ":1"}
	}
	spec := corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{c("app")}}
	switch shape {
	case shapeClassic:
		spec.Containers = append(spec.Containers, c("linkerd-proxy"))
	case shapeNative:
		always := corev1.ContainerRestartPolicyAlways
		proxy := c("linkerd-proxy")
		proxy.RestartPolicy = &always
		spec.InitContainers = []corev1.Container{proxy}
	case shapeLinkerdInit:
		spec.InitContainers = []corev1.Container{c("linkerd-init")}
		spec.Containers = append(spec.Containers, c("linkerd-proxy"))
	}
	mustCreate(t, "pod "+namespace+"/"+name, func() error {
		_, err := n.kube.Clientset.CoreV1().Pods(namespace).Create(context.Background(), &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Labels: labels, Annotations: annotations},
			Spec:       spec,
		}, metav1.CreateOptions{})
		return err
	})
}

// ---- network configuration ----

// netOpts shape the conflist [bridge+host-local, linkerd-cni].
type netOpts struct {
	mode       iptables.Mode  // linkerd.iptables-mode; "" is Linkerd's default (legacy)
	linkerd    map[string]any // overrides in the linkerd block
	top        map[string]any // extra top-level keys of the linkerd-cni entry
	kubernetes map[string]any // overrides in the kubernetes block
	noop       bool           // chain noopcni instead of linkerd-cni (benchmark baseline)
	alone      bool           // linkerd-cni alone, as a NetworkAttachmentDefinition holds it
	bridgeOnly bool           // the bridge alone: the pod's default network, before a NAD
	cniVersion string         // "" is 1.1.0
}

func (n *node) conflist(t testing.TB, o netOpts) *libcni.NetworkConfigList {
	t.Helper()
	linkerd := map[string]any{
		"incoming-proxy-port": 4143, "outgoing-proxy-port": 4140, "proxy-uid": 2102, "proxy-gid": -1,
		"ports-to-redirect": []int{}, "inbound-ports-to-ignore": []string{"4191", "4190"},
		"outbound-ports-to-ignore": []string{}, "subnets-to-ignore": []string{}, "simulate": false,
		"use-wait-flag": false, "iptables-mode": string(o.mode), "ipv6": true,
	}
	for k, v := range o.linkerd {
		linkerd[k] = v
	}
	kube := map[string]any{"kubeconfig": n.kubeconfig, "timeout": "5s"}
	for k, v := range o.kubernetes {
		kube[k] = v
	}
	plugin := map[string]any{"type": "linkerd-cni", "log_level": "debug", "log_file": n.logFile, "kubernetes": kube, "linkerd": linkerd,
		"state-dir": filepath.Join(n.dir, "state")}
	for k, v := range o.top {
		plugin[k] = v
	}
	if o.noop {
		plugin = map[string]any{"type": "noopcni"}
		for k, v := range o.top {
			plugin[k] = v
		}
	}
	bridge := map[string]any{"type": "bridge", "bridge": "cni0", "isDefaultGateway": true, "ipMasq": false,
		"ipam": map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": podSubnet}}},
			"dataDir": filepath.Join(n.dir, "ipam")}}
	plugins := []any{bridge, plugin}
	switch {
	case o.alone:
		plugins = []any{plugin}
	case o.bridgeOnly:
		plugins = []any{bridge}
	}
	ver := o.cniVersion
	if ver == "" {
		ver = "1.1.0"
	}
	list := map[string]any{"cniVersion": ver, "name": "k8s-pod-network", "plugins": plugins}
	b, err := json.Marshal(list)
	if err != nil {
		t.Fatal(err)
	}
	l, err := libcni.ConfListFromBytes(b)
	if err != nil {
		t.Fatalf("conflist: %v\n%s", err, b)
	}
	return l
}

var loopbackConf = func() *libcni.PluginConfig {
	c, err := libcni.NetworkPluginConfFromBytes([]byte(`{"cniVersion":"1.1.0","name":"cni-loopback","type":"loopback"}`))
	if err != nil {
		panic(err)
	}
	return c
}()

// ---- sandboxes ----

// sandbox is one pod sandbox: its network namespace and the runtime config used for it.
type sandbox struct {
	netns    ns.NetNS
	ns       *netnstest.NS
	rt       *libcni.RuntimeConf
	podIP    netip.Addr
	released bool
}

// newSandbox creates the pod's network namespace, as the runtime does before calling CNI. It is
// removed at cleanup unless the test removed it already.
func (n *node) newSandbox(t testing.TB, namespace, pod string) *sandbox {
	t.Helper()
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create pod netns: %v", err)
	}
	sb := n.sandboxAt(namespace, pod, netns.Path())
	sb.netns = netns
	t.Cleanup(func() { sb.remove(t) })
	return sb
}

// newUserNSSandbox is newSandbox for a pod with hostUsers: false: its network namespace belongs
// to a user namespace of its own (netnstest.NewUserNS), removed at cleanup.
func (n *node) newUserNSSandbox(t testing.TB, namespace, pod string) *sandbox {
	t.Helper()
	sb := n.sandboxAt(namespace, pod, netnstest.NewUserNS(t).Path())
	sb.released = true // NewUserNS removes it
	return sb
}

func (n *node) sandboxAt(namespace, pod, path string) *sandbox {
	id := fmt.Sprintf("%s-%d", pod, n.ids.Add(1))
	return &sandbox{
		ns: netnstest.Existing("pod "+namespace+"/"+pod, path),
		rt: &libcni.RuntimeConf{
			ContainerID: id, NetNS: path, IfName: "eth0",
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", pod},
				{"K8S_POD_INFRA_CONTAINER_ID", id}},
		},
	}
}

// remove deletes the sandbox's network namespace (the runtime does so after DEL).
func (sb *sandbox) remove(t testing.TB) {
	if sb.released {
		return
	}
	sb.released = true
	path := sb.netns.Path()
	if err := sb.netns.Close(); err != nil {
		t.Errorf("close netns %s: %v", path, err)
	}
	if err := testutils.UnmountNS(sb.netns); err != nil {
		t.Errorf("unmount netns %s: %v", path, err)
	}
}

// inNode runs f with the node's namespace as the current one, as a runtime on the node would: the
// plugins libcni starts inherit it.
func (n *node) inNode(f func(ctx context.Context) error) error {
	return n.ns.Do(func() error { return f(context.Background()) })
}

// add runs ADD like containerd: loopback on lo, then the conflist on eth0.
func (n *node) add(t testing.TB, list *libcni.NetworkConfigList, sb *sandbox) (types.Result, error) {
	t.Helper()
	var res types.Result
	err := n.inNode(func(ctx context.Context) error {
		lo := *sb.rt
		lo.IfName = "lo"
		if _, err := n.cni.AddNetwork(ctx, loopbackConf, &lo); err != nil {
			return fmt.Errorf("loopback ADD: %w", err)
		}
		var err error
		res, err = n.cni.AddNetworkList(ctx, list, sb.rt)
		return err
	})
	if err != nil {
		return nil, err
	}
	// No t.Fatal here: add also runs on goroutines.
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return nil, fmt.Errorf("convert the ADD result: %w", err)
	}
	for _, ip := range r.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP.To4()); ok {
			sb.podIP = a
		}
	}
	return res, nil
}

func (n *node) mustAdd(t testing.TB, list *libcni.NetworkConfigList, sb *sandbox) types.Result {
	t.Helper()
	res, err := n.add(t, list, sb)
	if err != nil {
		t.Fatalf("ADD %s: %v\n%s", sb.ns.Name(), err, n.logTail(sb.rt.ContainerID))
	}
	return res
}

func (n *node) check(list *libcni.NetworkConfigList, sb *sandbox) error {
	return n.inNode(func(ctx context.Context) error { return n.cni.CheckNetworkList(ctx, list, sb.rt) })
}

func (n *node) del(list *libcni.NetworkConfigList, sb *sandbox) error {
	return n.inNode(func(ctx context.Context) error { return n.cni.DelNetworkList(ctx, list, sb.rt) })
}

// logTail returns the plugin's log lines about one container, for failure messages.
func (n *node) logTail(containerID string) string {
	b, err := os.ReadFile(n.logFile)
	if err != nil {
		return "(no plugin log: " + err.Error() + ")"
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, "container_id="+containerID) {
			lines = append(lines, l)
		}
	}
	return "plugin log:\n" + strings.Join(lines, "\n")
}

// ---- rule assertions ----

// baseConfig is what the linkerd block of conflist means, before annotations.
func baseConfig(mode iptables.Mode) iptables.Config {
	if mode == "" {
		mode = iptables.ModeLegacy
	}
	return iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1,
		InboundPortsToIgnore: []string{"4191", "4190"}, IPv6: true, Mode: mode}
}

// expectRules asserts that the sandbox holds exactly the rules cfg describes, read back with the
// backend of cfg.Mode.
func expectRules(t testing.TB, sb *sandbox, cfg iptables.Config) {
	t.Helper()
	rs, err := iptables.Build(cfg)
	if err != nil {
		t.Fatalf("expected config does not build: %v", err)
	}
	var st iptables.State
	err = sb.ns.Do(func() error {
		a, _, err := runner.New(runner.Options{Mode: cfg.Mode})
		if err != nil {
			return err
		}
		st, err = a.Show(context.Background(), rs)
		return err
	})
	if err != nil {
		t.Fatalf("read rules in %s: %v", sb.ns.Name(), err)
	}
	if len(st.Families) == 0 || !st.Match() {
		var b strings.Builder
		for _, f := range st.Families {
			fmt.Fprintf(&b, "%s (%s):\n%s\n", f.Family, st.Backend, f.Diff)
		}
		t.Errorf("rules in %s differ from the expected ones:\n%s", sb.ns.Name(), b.String())
	}
}

// expectPassThrough runs ADD, CHECK and DEL for sb, each of which must succeed, and expects the
// plugin to have left sb's namespace untouched.
func (n *node) expectPassThrough(t testing.TB, list *libcni.NetworkConfigList, sb *sandbox) {
	t.Helper()
	n.mustAdd(t, list, sb)
	expectUntouched(t, sb)
	if err := n.check(list, sb); err != nil {
		t.Errorf("CHECK: %v", err)
	}
	if err := n.del(list, sb); err != nil {
		t.Errorf("DEL: %v", err)
	}
}

// expectUntouched asserts that the sandbox's netfilter state was never touched: no nftables table
// at all (native or iptables-nft) and no legacy chain of ours.
func expectUntouched(t testing.TB, sb *sandbox) {
	t.Helper()
	checkRules(t, sb, true)
}

// expectNoRules asserts that nothing of ours is left in the sandbox from any backend. Empty
// built-in nat chains that iptables-nft leaves behind after a cleanup are not ours.
func expectNoRules(t testing.TB, sb *sandbox) {
	t.Helper()
	checkRules(t, sb, false)
}

func checkRules(t testing.TB, sb *sandbox, untouched bool) {
	t.Helper()
	out, err := netnstest.RunIn(t, sb.ns, "nft", "list", "ruleset")
	if err != nil {
		t.Fatalf("nft list ruleset: %v", err)
	}
	ours := strings.Contains(out, "PROXY_INIT") || strings.Contains(out, iptables.NFTTableName) || strings.Contains(out, iptables.CommentPrefix)
	if ours || (untouched && strings.TrimSpace(out) != "") {
		t.Errorf("%s has nftables rules, want none:\n%s", sb.ns.Name(), out)
	}
	for _, bin := range []string{"iptables-legacy-save", "ip6tables-legacy-save"} {
		out, err := netnstest.RunIn(t, sb.ns, bin, "-t", "nat")
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		if strings.Contains(out, "PROXY_INIT") {
			t.Errorf("%s has legacy rules of ours (%s):\n%s", sb.ns.Name(), bin, out)
		}
	}
}

// readSysctl reads a sysctl inside the sandbox.
func readSysctl(t testing.TB, sb *sandbox, path string) string {
	t.Helper()
	var v []byte
	if err := sb.ns.Do(func() error {
		var err error
		v, err = os.ReadFile(path)
		return err
	}); err != nil {
		t.Fatalf("read %s in %s: %v", path, sb.ns.Name(), err)
	}
	return strings.TrimSpace(string(v))
}

// apiEvents returns the audit events of the plugin's service account that concern namespace ns:
// its pods and the namespace object itself.
func (n *node) apiEvents(t testing.TB, ns string) []kubetest.AuditEvent {
	t.Helper()
	evs, err := n.kube.AuditEvents(kubetest.ServiceAccountUser(cniNamespace, cniServiceAccount))
	if err != nil {
		t.Fatal(err)
	}
	var out []kubetest.AuditEvent
	for _, e := range evs {
		if e.ObjectRef == nil {
			continue
		}
		if e.ObjectRef.Namespace == ns || (e.ObjectRef.Resource == "namespaces" && e.ObjectRef.Name == ns) {
			out = append(out, e)
		}
	}
	return out
}

// waitAPIEvents waits until the audit log shows at least min events about ns.
func (n *node) waitAPIEvents(t testing.TB, ns string, min int) []kubetest.AuditEvent {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs := n.apiEvents(t, ns)
		if len(evs) >= min || time.Now().After(deadline) {
			return evs
		}
		time.Sleep(50 * time.Millisecond)
	}
}
