package install

// The DaemonSet's pod as a whole, for every rendering of the chart (deploy/linkerd-cni among
// them): its containers run as real processes, with the command, arguments and environment the
// manifest gives them (downward API and ConfigMap references resolved as the kubelet would), in a
// fresh network namespace standing in for the node's (the pod uses the host network), against a real kube-apiserver
// holding the rendering's RBAC. The probes are sent exactly where the manifest points them.

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubemesh/proxy-init/test/cnitest"
	"github.com/kubemesh/proxy-init/test/kubetest"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// podContainer is one container of the DaemonSet's pod template, ready to run.
type podContainer struct {
	name        string
	argv        []string
	env         map[string]string
	probes      map[string]string // probe kind -> host:port/path
	binaryInImg string
}

// daemonSetContainers reads the DaemonSet's containers and resolves their environment: fieldRef
// from the pod (namespace, node name), configMapKeyRef from the ConfigMaps in manifests.
func daemonSetContainers(t *testing.T, ms []manifest, node string) map[string]*podContainer {
	t.Helper()
	var ds *unstructured.Unstructured
	configMaps := map[string]map[string]any{}
	for _, m := range ms {
		switch m.obj.GetKind() {
		case "DaemonSet":
			ds = m.obj
		case "ConfigMap":
			data, _, _ := unstructured.NestedMap(m.obj.Object, "data")
			configMaps[m.obj.GetName()] = data
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet in deploy/linkerd-cni")
	}
	fields := map[string]string{"metadata.namespace": ds.GetNamespace(), "metadata.name": "linkerd-cni-" + node, "spec.nodeName": node}
	containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
	out := map[string]*podContainer{}
	for _, c := range containers {
		c := c.(map[string]any)
		pc := &podContainer{name: c["name"].(string), env: map[string]string{}, probes: map[string]string{}}
		cmd, _, _ := unstructured.NestedStringSlice(c, "command")
		args, _, _ := unstructured.NestedStringSlice(c, "args")
		if len(cmd) == 0 {
			t.Fatalf("container %s has no command", pc.name)
		}
		pc.binaryInImg, pc.argv = cmd[0], append(cmd[1:], args...)
		env, _, _ := unstructured.NestedSlice(c, "env")
		for _, e := range env {
			e := e.(map[string]any)
			name := e["name"].(string)
			if v, ok := e["value"].(string); ok {
				pc.env[name] = v
				continue
			}
			if fp, ok, _ := unstructured.NestedString(e, "valueFrom", "fieldRef", "fieldPath"); ok {
				v, known := fields[fp]
				if !known {
					t.Fatalf("container %s: %s from unsupported fieldRef %s", pc.name, name, fp)
				}
				pc.env[name] = v
				continue
			}
			if cm, ok, _ := unstructured.NestedString(e, "valueFrom", "configMapKeyRef", "name"); ok {
				key, _, _ := unstructured.NestedString(e, "valueFrom", "configMapKeyRef", "key")
				v, known := configMaps[cm][key].(string)
				if !known {
					t.Fatalf("container %s: %s from ConfigMap %s key %s, which deploy/ does not have", pc.name, name, cm, key)
				}
				pc.env[name] = v
				continue
			}
			t.Fatalf("container %s: unsupported env source for %s: %v", pc.name, name, e)
		}
		for _, p := range []string{"readinessProbe", "livenessProbe"} {
			host, _, _ := unstructured.NestedString(c, p, "httpGet", "host")
			port, _, _ := unstructured.NestedInt64(c, p, "httpGet", "port")
			path, _, _ := unstructured.NestedString(c, p, "httpGet", "path")
			if host == "" || port == 0 || path == "" {
				t.Fatalf("container %s: %s is not an httpGet with host, port and path", pc.name, p)
			}
			pc.probes[p] = net.JoinHostPort(host, itoa(port)) + path
		}
		out[pc.name] = pc
	}
	return out
}

// nodeProcess is a container's process running in the node's namespace.
type nodeProcess struct {
	cmd    *exec.Cmd
	out    *cnitest.SyncBuffer
	exited chan struct{}
	err    error
}

// startIn starts argv inside node with env (and nothing else of the test's environment, as a
// container gets nothing else); the process is SIGKILLed by t.Cleanup if still running.
func startIn(t *testing.T, node *netnstest.NS, bin string, argv []string, env map[string]string) *nodeProcess {
	t.Helper()
	p := &nodeProcess{out: &cnitest.SyncBuffer{}, exited: make(chan struct{})}
	p.cmd = exec.Command(bin, argv...)
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	// A child inherits the network namespace of the thread that forks it.
	if err := node.Do(func() error { return p.cmd.Start() }); err != nil {
		t.Fatalf("start %s %q: %v", bin, argv, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
		if t.Failed() {
			t.Logf("output of %q:\n%s", argv, p.out.String())
		}
	})
	return p
}

// probe sends GET to host:port/path from inside node, as the kubelet's HTTP probe does for a
// host-network pod, and returns the status code.
func probeURL(node *netnstest.NS, target string) (int, error) {
	hostport, path, _ := strings.Cut(target, "/")
	var conn net.Conn
	// The socket is created on the locked thread inside the namespace and keeps it.
	if err := node.Do(func() error {
		var err error
		conn, err = net.DialTimeout("tcp", hostport, 2*time.Second)
		return err
	}); err != nil {
		return 0, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintf(conn, "GET /%s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", path, hostport); err != nil {
		return 0, err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestDaemonSetPodAgainstAPIServer runs the pod of every rendering: deploy/linkerd-cni with
// optional/ and the one documented extra argument, and the chart's other renderings with its
// nodeTaint value (which adds the same argument and objects).
func TestDaemonSetPodAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: builds linkerd-cni and starts kube-apiserver")
	}
	netnstest.RequireRoot(t)
	image := t.TempDir() // the image's /opt/cni/bin: the node's plugin-only build
	goBuild(t, image, cnitest.NodeBinaries...)
	full := t.TempDir() // the image's /usr/local/bin: install and repair
	goBuild(t, full, "github.com/kubemesh/proxy-init/cmd/linkerd-cni")
	bin := filepath.Join(full, "linkerd-cni")
	ch := loadChart(t)
	for _, r := range renderings(t) {
		t.Run(r.name, func(t *testing.T) {
			var ms []manifest
			var extraArgs []string
			if r.values == nil {
				dir := filepath.Join(deployDir(t), "linkerd-cni")
				ms = loadManifests(t, dir, filepath.Join(dir, "optional"))
				// The documented way to enable prevention: one more argument.
				extraArgs = []string{"--node-taint=" + startupTaint}
			} else {
				ms = renderChart(t, ch, merge(r.values, map[string]any{"nodeTaint": startupTaint}))
			}
			runDaemonSetPod(t, r, ms, extraArgs, bin, image)
		})
	}
}

func runDaemonSetPod(t *testing.T, r rendering, ms []manifest, extraArgs []string, bin, image string) {
	node := netnstest.NewNS(t)
	cluster := kubetest.Start(t, kubetest.Options{NetNSPath: node.Path()})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	api := newAPIClient(t, cluster.AdminConfig())
	// The base objects the pod needs, and the node-taint RBAC and admission policy, as the
	// docs/install.md says to apply with --node-taint.
	for _, m := range ms {
		if m.obj.GetKind() == "Namespace" || isAccess(m) {
			if _, err := api.apply(ctx, m.obj, false); err != nil {
				t.Fatalf("apply %s: %v", m, err)
			}
		}
	}
	const nodeName = "node-1"
	n, err := api.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{{Key: startupTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tainted := func() bool {
		t.Helper()
		n, err := api.cs.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return hasTaint(n.Spec.Taints, startupTaint)
	}
	if !hasTaint(n.Spec.Taints, startupTaint) {
		t.Fatalf("node created without the startup taint: %v", n.Spec.Taints)
	}

	// The kubelet's part: the projected service account (a token bound to the pod, hence to
	// the node), the API server's address, and the node's directories under the container's
	// mount prefix.
	token := boundToken(t, ctx, api.cs, nodeName)
	root := t.TempDir()
	h := &host{saDir: filepath.Join(root, "serviceaccount")}
	if err := os.MkdirAll(h.saDir, 0o755); err != nil {
		t.Fatal(err)
	}
	apiHost, apiPort := h.projectClusterSA(t, cluster, token)
	containers := daemonSetContainers(t, ms, nodeName)
	install, second := containers["install-cni"], containers[map[string]string{"agent": "linkerd-cni-agent", "repair": "repair-controller"}[r.second]]
	if install == nil || (second != nil) != (r.second != "") {
		t.Fatalf("containers = %v, want install-cni and %q", containers, r.second)
	}
	for _, c := range containers {
		if c.binaryInImg != "/usr/local/bin/linkerd-cni" {
			t.Fatalf("container %s runs %s, not the image's linkerd-cni", c.name, c.binaryInImg)
		}
		c.env["KUBERNETES_SERVICE_HOST"], c.env["KUBERNETES_SERVICE_PORT"] = apiHost, apiPort
	}
	prefix := filepath.Join(root, "host")
	netDir := filepath.Join(prefix, install.env["DEST_CNI_NET_DIR"])
	install.env["CONTAINER_MOUNT_PREFIX"] = prefix
	install.env["CONTAINER_CNI_BIN_DIR"] = image
	install.env["SERVICE_ACCOUNT_PATH"] = h.saDir
	kubeconfig := filepath.Join(netDir, install.env["KUBECONFIG_FILE_NAME"])

	installer := startIn(t, node, bin, append(install.argv, extraArgs...), install.env)
	waitFor(t, 20*time.Second, "install-cni to answer its liveness probe", func() (bool, string) {
		code, err := probeURL(node, install.probes["livenessProbe"])
		return code == 200, fmt.Sprint(code, err, installer.out.String())
	})
	if r.standalone == "" {
		if code, _ := probeURL(node, install.probes["readinessProbe"]); code != 503 {
			t.Errorf("install-cni readiness = %d before any CNI config, want 503", code)
		}
		time.Sleep(500 * time.Millisecond)
		if !tainted() {
			t.Fatal("startup taint removed before any CNI config existed")
		}
	}

	// The repair controller and the agent need only the base RBAC and the token:
	// rest.InClusterConfig reads fixed paths, and the same token through the installer's
	// kubeconfig gives them the same identity. The agent's node paths (its socket, the node's
	// /proc, the CRI socket, the CNI config) are where this test keeps them.
	waitFor(t, 10*time.Second, "the kubeconfig", func() (bool, string) {
		_, err := os.Stat(kubeconfig)
		return err == nil, fmt.Sprint(err)
	})
	procs := []*nodeProcess{installer}
	if second != nil {
		second.env["KUBECONFIG"] = kubeconfig
		argv := second.argv
		if r.second == "agent" {
			// The node's paths where this test keeps them; the socket only where the rendering
			// serves one, so the agent watches what that rendering's RBAC lets it.
			argv = append(slices.Clone(argv), "--host-proc=/proc",
				"--cri-socket=unix://"+filepath.Join(root, "cri.sock"), "--cni-net-dir="+netDir)
			if !r.noLookups {
				argv = append(argv, "--socket="+filepath.Join(root, "run", "agent.sock"))
			}
		}
		p := startIn(t, node, bin, argv, second.env)
		for _, probe := range []string{"livenessProbe", "readinessProbe"} {
			waitFor(t, 20*time.Second, second.name+" "+probe, func() (bool, string) {
				code, err := probeURL(node, second.probes[probe])
				return code == 200, fmt.Sprint(code, err, p.out.String())
			})
		}
		procs = append(procs, p)
	}

	// The primary CNI arrives: the plugin goes in, the pod turns ready, the taint goes. With a
	// standalone config (for Multus NetworkAttachmentDefinitions) that file is the plugin's place,
	// and other configs stay as they are.
	conf := filepath.Join(netDir, "10-calico.conflist")
	if err := os.WriteFile(conf, []byte(calicoConflist), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "install-cni readiness", func() (bool, string) {
		code, err := probeURL(node, install.probes["readinessProbe"])
		return code == 200, fmt.Sprint(code, err)
	})
	waitFor(t, 10*time.Second, "the startup taint to be removed", func() (bool, string) {
		return !tainted(), installer.out.String()
	})
	b, _ := os.ReadFile(conf)
	switch {
	case r.standalone == "" && !hasLinkerdLast(string(b)):
		t.Errorf("taint removed, but the conflist does not carry the plugin:\n%s", b)
	case r.standalone != "" && string(b) != calicoConflist:
		t.Errorf("with a standalone config, the installer chained into %s:\n%s", conf, b)
	}
	if r.standalone != "" {
		if b, err := os.ReadFile(filepath.Join(netDir, r.standalone)); err != nil || !strings.Contains(string(b), `"type":"linkerd-cni"`) {
			t.Errorf("standalone config %s: %q, %v", r.standalone, b, err)
		}
	}

	// Pod deletion: SIGTERM to both; the installer restores the node's config.
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
			if p.err != nil {
				t.Errorf("%q after SIGTERM: %v\n%s", p.cmd.Args, p.err, p.out.String())
			}
		case <-time.After(15 * time.Second):
			t.Errorf("%q did not exit within 15s of SIGTERM", p.cmd.Args)
		}
	}
	if b, _ := os.ReadFile(conf); string(b) != calicoConflist {
		t.Errorf("conflist not restored after SIGTERM:\n%s", b)
	}
	if tainted() {
		t.Error("the startup taint came back on uninstall")
	}
}
