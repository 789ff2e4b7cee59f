package install

// The end-to-end test: the deploy/ RBAC in a real kube-apiserver, a TokenRequest token for the
// linkerd-cni ServiceAccount projected like the kubelet does, the installer writing the
// kubeconfig and patching a real bridge conflist, and the real linkerd-cni binary (the one the
// installer copied) performing an ADD through libcni, as containerd does, with that kubeconfig.
// Everything network-related lives in namespaces the test creates.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/plugins/pkg/testutils"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/cnitest"
	"github.com/kubemesh/proxy-init/test/kubetest"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// goBuild builds as `make build` does (cnitest.GoBuild); args are extra go build flags, then
// packages.
func goBuild(t *testing.T, dir string, args ...string) {
	t.Helper()
	if err := cnitest.GoBuild(dir, args...); err != nil {
		t.Fatal(err)
	}
}

// projectClusterSA projects token and cluster's CA into h's service-account volume, as the
// kubelet does for the DaemonSet's pods, and returns the API server's host and port as the
// kubelet's KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT would give them.
func (h *host) projectClusterSA(t *testing.T, cluster *kubetest.Cluster, token string) (host, port string) {
	t.Helper()
	h.projectSA(t, map[string]string{"token": token, "ca.crt": string(cluster.CAData), "namespace": "linkerd-cni"})
	u, err := url.Parse(cluster.Host)
	if err != nil {
		t.Fatal(err)
	}
	return u.Hostname(), u.Port()
}

func TestInstalledPluginPerformsADD(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: builds the plugins and starts kube-apiserver")
	}
	netnstest.RequireRoot(t)
	plugins, err := cnitest.PluginsDir()
	if err != nil {
		t.Fatalf("build CNI plugins: %v", err)
	}
	image := t.TempDir() // the image's /opt/cni/bin: the node's plugin-only build
	goBuild(t, image, cnitest.NodeBinaries...)

	node := netnstest.NewNS(t)
	cluster := kubetest.Start(t, kubetest.Options{NetNSPath: node.Path()})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api := newAPIClient(t, cluster.AdminConfig())
	var cmData string
	for _, m := range loadManifests(t, filepath.Join(deployDir(t), "linkerd-cni")) {
		switch {
		case m.obj.GetKind() == "Namespace" || isAccess(m):
			if _, err := api.apply(ctx, m.obj, false); err != nil {
				t.Fatalf("apply %s: %v", m, err)
			}
		case m.obj.GetKind() == "ConfigMap":
			cmData = m.obj.Object["data"].(map[string]any)["cni_network_config"].(string)
		}
	}
	token, err := cluster.TokenFor(ctx, "linkerd-cni", "linkerd-cni")
	if err != nil {
		t.Fatal(err)
	}

	// The node's file system, without a mount prefix: the plugin process reads the kubeconfig
	// at the path the installer wrote into the conflist.
	root := t.TempDir()
	netDir := filepath.Join(root, "etc/cni/net.d")
	binDir := filepath.Join(root, "opt/cni/bin")
	if err := os.MkdirAll(netDir, 0o755); err != nil {
		t.Fatal(err)
	}
	h := &host{saDir: filepath.Join(root, "serviceaccount")}
	if err := os.MkdirAll(h.saDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// The plugin's lock files and records go to a directory of the test's, not the machine's
	// /var/run/linkerd-cni.
	var netConf map[string]any
	if err := json.Unmarshal([]byte(cmData), &netConf); err != nil {
		t.Fatal(err)
	}
	netConf["state-dir"] = filepath.Join(root, "run", "linkerd-cni")
	b, err := json.Marshal(netConf)
	if err != nil {
		t.Fatal(err)
	}
	cmData = string(b)
	apiHost, apiPort := h.projectClusterSA(t, cluster, token)
	primary := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "k8s-pod-network",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isDefaultGateway": true,
      "ipMasq": false,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "203.0.113.0/24"}]], "dataDir": %q}
    }
  ]
}
`, filepath.Join(root, "ipam"))
	confPath := filepath.Join(netDir, "10-bridge.conflist")
	if err := os.WriteFile(confPath, []byte(primary), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		DestNetDir: netDir, DestBinDir: binDir, ContainerBinDir: image,
		NetworkConfig:     cmData,
		ServiceAccountDir: h.saDir,
		ServiceHost:       apiHost, ServicePort: apiPort,
		Namespace: "linkerd-cni", AdminAddr: "-", Debounce: 20 * time.Millisecond,
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(runCtx, cfg, slogFor(t)) }()
	stopped := false
	stopInstaller := func() error {
		if stopped {
			return nil
		}
		stopped = true
		stop()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			return errors.New("installer did not stop")
		}
	}
	t.Cleanup(func() { _ = stopInstaller() })
	waitFor(t, 10*time.Second, "the installer to patch the conflist", func() (bool, string) {
		b, _ := os.ReadFile(confPath)
		return hasLinkerdLast(string(b)), string(b)
	})

	// The runtime's view: the list as containerd would load it from the net dir.
	list, err := libcni.ConfListFromFile(confPath)
	if err != nil {
		t.Fatal(err)
	}
	cs := api.cs
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "emojivoto"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	always := corev1.ContainerRestartPolicyAlways
	meshed := func(ns, name string) {
		t.Helper()
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "linkerd-proxy", Image: "registry.invalid/proxy:1", RestartPolicy: &always}},
			Containers:     []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}},
		}}
		if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	meshed("emojivoto", "web")
	meshed("linkerd-cni", "excluded") // meshed-looking, but in the installer's own namespace

	stderr, err := os.Create(filepath.Join(root, "plugins.stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cni := libcni.NewCNIConfigWithCacheDir([]string{binDir, plugins}, filepath.Join(root, "cache"),
		&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: stderr}})
	lo, err := libcni.NetworkPluginConfFromBytes([]byte(`{"cniVersion":"1.0.0","name":"cni-loopback","type":"loopback"}`))
	if err != nil {
		t.Fatal(err)
	}
	sandbox := func(ns, pod string) (*netnstest.NS, *libcni.RuntimeConf) {
		t.Helper()
		netns, err := testutils.NewNS()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = netns.Close()
			if err := testutils.UnmountNS(netns); err != nil {
				t.Errorf("remove netns %s: %v", netns.Path(), err)
			}
		})
		id := "sandbox-" + pod
		return netnstest.Existing("pod "+ns+"/"+pod, netns.Path()), &libcni.RuntimeConf{
			ContainerID: id, NetNS: netns.Path(), IfName: "eth0",
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", ns}, {"K8S_POD_NAME", pod}, {"K8S_POD_INFRA_CONTAINER_ID", id}},
		}
	}
	// add runs ADD as containerd does, from the node's namespace: loopback, then the list.
	add := func(rt *libcni.RuntimeConf) error {
		return node.Do(func() error {
			l := *rt
			l.IfName = "lo"
			if _, err := cni.AddNetwork(context.Background(), lo, &l); err != nil {
				return fmt.Errorf("loopback ADD: %w", err)
			}
			_, err := cni.AddNetworkList(context.Background(), list, rt)
			return err
		})
	}
	del := func(rt *libcni.RuntimeConf) error {
		return node.Do(func() error { return cni.DelNetworkList(context.Background(), list, rt) })
	}

	webNS, webRT := sandbox("emojivoto", "web")
	if err := add(webRT); err != nil {
		b, _ := os.ReadFile(stderr.Name())
		t.Fatalf("ADD of a meshed pod with the installer's kubeconfig failed: %v\nplugin stderr:\n%s", err, b)
	}
	// The rules the ConfigMap's config describes are in the pod's namespace.
	want := iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1,
		InboundPortsToIgnore: []string{"4191", "4190"}, IPv6: false, Mode: iptables.ModeNFT}
	rs, err := iptables.Build(want)
	if err != nil {
		t.Fatal(err)
	}
	var st iptables.State
	if err := webNS.Do(func() error {
		a, _, err := runner.New(runner.Options{Mode: want.Mode})
		if err != nil {
			return err
		}
		st, err = a.Show(context.Background(), rs)
		return err
	}); err != nil {
		t.Fatalf("read rules in the pod: %v", err)
	}
	// Show reads both families; with "ipv6": false the IPv6 one must be empty.
	v4 := 0
	for _, f := range st.Families {
		if f.Family == iptables.IPv4 {
			v4 = len(f.Rules)
		}
	}
	if v4 == 0 || !st.Match() {
		for _, f := range st.Families {
			t.Errorf("rules in the pod (%s):\n%s\n%s", f.Family, strings.Join(f.Rules, "\n"), f.Diff.String())
		}
	}
	// It was the installer's token that looked the pod up.
	user := kubetest.ServiceAccountUser("linkerd-cni", "linkerd-cni")
	evs, err := cluster.WaitAuditEvents(ctx, user, func(evs []kubetest.AuditEvent) bool {
		for _, e := range evs {
			if e.ObjectRef != nil && e.ObjectRef.Namespace == "emojivoto" && e.ObjectRef.Name == "web" && e.Code() == 200 {
				return true
			}
		}
		return false
	})
	if err != nil {
		t.Fatalf("no successful lookup of emojivoto/web by %s: %v (events %+v)", user, err, evs)
	}

	// A pod in the installer's namespace is passed through untouched, without an API call.
	exNS, exRT := sandbox("linkerd-cni", "excluded")
	if err := add(exRT); err != nil {
		t.Fatalf("ADD in the excluded namespace: %v", err)
	}
	if out, err := netnstest.RunIn(t, exNS, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("excluded pod got rules (err %v):\n%s", err, out)
	}
	time.Sleep(200 * time.Millisecond)
	evs, _ = cluster.AuditEvents(user)
	for _, e := range evs {
		if e.ObjectRef != nil && e.ObjectRef.Name == "excluded" {
			t.Errorf("the plugin looked up a pod of an excluded namespace: %s %s", e.Verb, e.RequestURI)
		}
	}

	for _, rt := range []*libcni.RuntimeConf{webRT, exRT} {
		if err := del(rt); err != nil {
			t.Errorf("DEL %s: %v", rt.ContainerID, err)
		}
	}
	// Uninstall: the conflist is the primary's again, byte for byte; kubeconfig and binary gone.
	if err := stopInstaller(); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	if b, _ := os.ReadFile(confPath); string(b) != primary {
		t.Errorf("conflist after uninstall:\n%s", b)
	}
	for _, p := range []string{filepath.Join(netDir, "ZZZ-linkerd-cni-kubeconfig"), filepath.Join(binDir, "linkerd-cni")} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s still exists after uninstall (err %v)", p, err)
		}
	}
}
