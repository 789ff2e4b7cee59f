package agent_test

// The kubelet's pods API as the agent's source while its watches cannot sync: a fake kubelet
// serving the kubelet's published gRPC service (k8s.io/kubelet/pkg/apis/pods/v1alpha1) on a
// root-only socket, and a fake API server that answers nothing (or only a namespace GET), so the
// agent has just started into an API outage. The plugin's own code calls the agent, as on a node.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/cnitest"
	"github.com/kubemesh/proxy-init/test/kubelettest"
	"github.com/kubemesh/proxy-init/test/kubetest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// deadAPI is an API server that refuses every request but, when ns is set, a GET of that
// namespace; it counts the requests by verb and path.
type deadAPI struct {
	ns    *corev1.Namespace
	mu    sync.Mutex
	count map[string]int
}

func (d *deadAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	d.count[r.Method+" "+r.URL.Path]++
	d.mu.Unlock()
	if d.ns != nil && r.Method == http.MethodGet && r.URL.Path == "/api/v1/namespaces/"+d.ns.Name {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(fmt.Appendf(nil, `{"apiVersion":"v1","kind":"Namespace","metadata":{"name":%q,"annotations":{%q:%q}}}`,
			d.ns.Name, cniplugin.AnnotationSkipOutboundPorts, d.ns.Annotations[cniplugin.AnnotationSkipOutboundPorts]))
		return
	}
	http.Error(w, "the API server is down", http.StatusServiceUnavailable)
}

func (d *deadAPI) requests(prefix string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for k, v := range d.count {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}

// kubeletRig is an agent that has just started into an API outage, with the kubelet's pods API.
type kubeletRig struct {
	t       *testing.T
	a       *agent.Agent
	api     *deadAPI
	kubelet *kubelettest.Kubelet
	socket  string
	conf    []byte
	log     *cnitest.SyncBuffer
}

func newKubeletRig(t *testing.T, api *deadAPI) *kubeletRig {
	t.Helper()
	nt.RequireRoot(t)
	dir, err := os.MkdirTemp("", "agent-kubelet-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r := &kubeletRig{t: t, api: api, kubelet: kubelettest.New(), socket: filepath.Join(dir, "run", "agent.sock"), log: &cnitest.SyncBuffer{}}
	api.count = map[string]int{}
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	client, err := kubeclient.New(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	kubeletSock := r.kubelet.Serve(t, filepath.Join(dir, "kubelet", "pods-api", "pods-api.sock")).Socket
	r.conf = pluginConf(r.socket, iptables.ModeNFT, true)
	log := slog.New(slog.NewTextHandler(io.MultiWriter(r.log, testWriter{t}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	r.a, err = agent.New(client, agent.Options{NodeName: "node-k", Socket: r.socket, KubeletPodsSocket: kubeletSock, HostProc: "/proc",
		LookupWait: 300 * time.Millisecond, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done: // the watches never synced: Run returns the cancellation
		case <-time.After(waitLong):
			t.Error("agent did not stop")
		}
	})
	waitFor(t, "the agent's socket", func() bool { _, err := os.Stat(r.socket); return err == nil })
	return r
}

// kubeletPod is a meshed pod of the node, known to the kubelet only.
func (r *kubeletRig) kubeletPod(name string, annotations map[string]string) (*corev1.Pod, *nt.NS) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "app", UID: k8stypes.UID("uid-" + name), Annotations: annotations},
		Spec: corev1.PodSpec{NodeName: "node-k",
			Containers: []corev1.Container{{Name: "app", Image: "app:test"}, {Name: cniplugin.ProxyContainerName, Image: "proxy:test"}}},
	}
	r.kubelet.Add(p)
	return p, nt.NewNS(r.t)
}

// add runs the plugin's ADD for p in netns, as the runtime does; its API path fails and says so.
func (r *kubeletRig) add(p *corev1.Pod, netns *nt.NS) (stderr string, apiCalls int, err error) {
	var out, errOut bytes.Buffer
	pl := cniplugin.NewNodePlugin()
	pl.Stdout, pl.Stderr = &out, &errOut
	pl.NewPodAPI = func(*cniplugin.NetConf) (cniplugin.PodAPI, error) {
		apiCalls++
		return nil, errors.New("the plugin's API path: the API server is down")
	}
	id := "sandbox-" + p.Name
	err = pl.Funcs().Add(&skel.CmdArgs{ContainerID: id, Netns: netns.Path(), IfName: "eth0", Path: "/opt/cni/bin",
		Args:      fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s", p.Namespace, p.Name, id, p.UID),
		StdinData: r.conf})
	return errOut.String(), apiCalls, err
}

func (r *kubeletRig) metric(name string) string {
	rec := httptest.NewRecorder()
	r.a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(agent.MetricsPrefix+name) + ` (\S+)$`).FindStringSubmatch(rec.Body.String())
	if m == nil {
		return ""
	}
	return m[1]
}

// everyAnnotation sets each annotation the plugin honours on the pod, so that it needs nothing
// of its namespace's.
var everyAnnotation = map[string]string{
	cniplugin.AnnotationSkipOutboundPorts: "9999", cniplugin.AnnotationSkipInboundPorts: "9998",
	cniplugin.AnnotationSkipSubnets: "192.0.2.0/24", cniplugin.AnnotationSkipInboundSubnets: "198.51.100.0/24",
	cniplugin.AnnotationSkipOutboundSubnets: "203.0.113.0/24", cniplugin.AnnotationProxyUID: "2102",
	cniplugin.AnnotationProxyGID: "2102", cniplugin.AnnotationInboundPort: "4143", cniplugin.AnnotationOutboundPort: "4140",
	cniplugin.AnnotationCloseWaitTimeout: "3600", cniplugin.AnnotationRerouteVirtualInterfaces: "tap0",
}

// TestKubeletLookups: an agent whose watches cannot sync (the API server is down since it
// started) answers the plugin with the pod from the kubelet's pods API. A pod that carries every
// annotation starts meshed with no API request of the plugin's; a pod that needs its namespace's
// gets it from one API read when the API answers that, and fails closed (CNI error 11, saying
// why) when it does not; a pod the kubelet does not know goes to the plugin's API path.
func TestKubeletLookups(t *testing.T) {
	if cniplugin.NeedsNamespace(everyAnnotation) {
		t.Fatal("everyAnnotation lacks an annotation the plugin honours")
	}
	t.Run("API down: a pod with every annotation starts meshed", func(t *testing.T) {
		r := newKubeletRig(t, &deadAPI{})
		p, netns := r.kubeletPod("web", everyAnnotation)
		stderr, apiCalls, err := r.add(p, netns)
		if err != nil {
			t.Fatalf("ADD: %v\n%s", err, stderr)
		}
		if apiCalls != 0 {
			t.Errorf("the plugin took its API path %d times; want the agent's answer", apiCalls)
		}
		for _, want := range []string{`msg="rules written"`, "kind=meshed", "source=kubelet api_requests=0"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("the plugin's log lacks %s:\n%s", want, stderr)
			}
		}
		if out, err := nt.RunIn(t, netns, "iptables-nft-save", "-t", "nat"); err != nil || !strings.Contains(out, "proxy-init/ignore-port-9999") || !strings.Contains(out, "PROXY_INIT_REDIRECT") {
			t.Errorf("the pod's rules (from its annotations) are not written: %v\n%s", err, out)
		}
		if got := r.kubelet.Calls(); len(got) != 1 || got[0] != "GetPod uid-web" {
			t.Errorf("the kubelet was asked %v; want one GetPod by the pod's UID", got)
		}
		waitFor(t, "the ADD's report", func() bool { return r.metric(`plugin_lookups_total{source="kubelet"}`) == "1" })
		if got := r.metric(`socket_requests_total{outcome="kubelet"}`); got != "1" {
			t.Errorf(`socket_requests_total{outcome="kubelet"} = %q, want 1`, got)
		}
		if !strings.Contains(r.log.String(), `msg="pod looked up from the kubelet's pods API" node=node-k pod=app/web uid=uid-web command=ADD synced=false`) {
			t.Errorf("the agent did not say the pod came from the kubelet:\n%s", r.log)
		}
		// The agent's only API requests: its failing watches' lists, and one namespace GET.
		if n := r.api.requests("GET /api/v1/namespaces/app"); n != 1 {
			t.Errorf("the agent read the namespace %d times, want once", n)
		}
	})

	t.Run("API down: a pod that needs its namespace fails closed", func(t *testing.T) {
		r := newKubeletRig(t, &deadAPI{})
		p, netns := r.kubeletPod("plain", nil)
		stderr, apiCalls, err := r.add(p, netns)
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater {
			t.Fatalf("ADD: %v; want CNI error 11 (try again later)\n%s", err, stderr)
		}
		for _, want := range []string{"its namespace's annotations cannot be read", "the node agent read the pod from the kubelet but has no namespace app to give",
			"the agent's namespace watch has not synced and the API server did not answer", "the server is currently unable to handle the request"} {
			if !strings.Contains(ce.Msg, want) {
				t.Errorf("the error lacks %q: %s", want, ce.Msg)
			}
		}
		if apiCalls != 0 {
			t.Errorf("the plugin asked the API server %d times after the agent did", apiCalls)
		}
		if out, _ := nt.RunIn(t, netns, "iptables-nft-save", "-t", "nat"); strings.Contains(out, "PROXY_INIT") {
			t.Errorf("rules written for a pod whose settings are unknown:\n%s", out)
		}
	})

	t.Run("only a namespace GET answers: the pod inherits its namespace's annotations", func(t *testing.T) {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "app", Annotations: map[string]string{cniplugin.AnnotationSkipOutboundPorts: "7777"}}}
		r := newKubeletRig(t, &deadAPI{ns: ns})
		p, netns := r.kubeletPod("inherits", nil)
		stderr, apiCalls, err := r.add(p, netns)
		if err != nil || apiCalls != 0 {
			t.Fatalf("ADD: %v, %d API paths taken\n%s", err, apiCalls, stderr)
		}
		if !strings.Contains(stderr, "source=kubelet api_requests=0") {
			t.Errorf("the plugin's log lacks source=kubelet:\n%s", stderr)
		}
		if out, err := nt.RunIn(t, netns, "iptables-nft-save", "-t", "nat"); err != nil || !strings.Contains(out, "proxy-init/ignore-port-7777") {
			t.Errorf("the namespace's skip-outbound-ports is not in the rules: %v\n%s", err, out)
		}
	})

	t.Run("a pod the kubelet does not know: the plugin's API path", func(t *testing.T) {
		r := newKubeletRig(t, &deadAPI{})
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "ghost", Namespace: "app", UID: "uid-ghost"}}
		stderr, apiCalls, err := r.add(p, nt.NewNS(t))
		if err == nil || apiCalls != 1 {
			t.Fatalf("ADD: %v after %d API paths; want the plugin's own (failing) API read\n%s", err, apiCalls, stderr)
		}
		if !strings.Contains(stderr, "not-synced: the agent's watches have not synced yet, and the kubelet's pods API") || !strings.Contains(stderr, "not found") {
			t.Errorf("the plugin's log does not say why the agent had no pod:\n%s", stderr)
		}
	})
}

// TestKubeletSocketChecked: the agent talks only to a kubelet socket that root owns in a
// directory only root may write, since it acts on the answer.
func TestKubeletSocketChecked(t *testing.T) {
	r := newKubeletRig(t, &deadAPI{})
	p, netns := r.kubeletPod("web", everyAnnotation)
	dir := filepath.Dir(filepath.Join(filepath.Dir(filepath.Dir(r.socket)), "kubelet", "pods-api", "pods-api.sock"))
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	stderr, apiCalls, err := r.add(p, netns)
	if err == nil || apiCalls != 1 {
		t.Fatalf("ADD: %v after %d API paths; want the plugin's own API read", err, apiCalls)
	}
	if want := dir + " is writable by others than root (mode 777)"; !strings.Contains(stderr, want) {
		t.Errorf("the plugin's log lacks %q:\n%s", want, stderr)
	}
	if got := r.kubelet.Calls(); len(got) != 0 {
		t.Errorf("the kubelet was asked %v through a socket anyone may replace", got)
	}
}

// testKubeletOnlyPod: with its watches synced, the agent answers for a pod of its node that the
// watch does not hold (here one the API server never had, as a static pod's) from the kubelet's
// pods API at once, its namespace from the watch; the plugin sets it up with no API request.
func testKubeletOnlyPod(t *testing.T, c *kubetest.Cluster) {
	dir, err := os.MkdirTemp("", "kubelet-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	k := kubelettest.New().Serve(t, filepath.Join(dir, "pods-api", "pods-api.sock"))
	r := newRig(t, c, rigOpts{kubeletPods: k.Socket})
	if _, err := r.admin.CoreV1().Namespaces().Patch(context.Background(), r.ns, k8stypes.MergePatchType,
		fmt.Appendf(nil, `{"metadata":{"annotations":{%q:"5555"}}}`, cniplugin.AnnotationSkipOutboundPorts), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "static-web", Namespace: r.ns, UID: "uid-static-web"},
		Spec: corev1.PodSpec{NodeName: r.node, Containers: []corev1.Container{{Name: "app"}, {Name: cniplugin.ProxyContainerName}}}}
	k.Add(obj)
	p := &pod{obj: obj, netns: nt.NewNS(t), id: "sandbox-static-web"}
	// CHECK writes nothing; until ADD, it fails naming the rules it expects, which hold the
	// namespace's port once the agent's watch has delivered the annotation.
	waitFor(t, "the namespace's annotation in the watch", func() bool {
		return strings.Contains(r.run("CHECK", r.args(p, r.conf)).stderr, "5555")
	})
	add := r.run("ADD", r.args(p, r.conf))
	if add.err != nil {
		t.Fatalf("ADD: %v\n%s", add.err, add.stderr)
	}
	if calls := add.api.Calls(); len(calls) != 0 {
		t.Errorf("ADD read %v from the API; want the kubelet's pod through the agent", calls)
	}
	if !strings.Contains(add.stderr, "source=kubelet api_requests=0") {
		t.Errorf("the plugin's log lacks source=kubelet:\n%s", add.stderr)
	}
	if out, err := nt.RunIn(t, p.netns, "iptables-nft-save", "-t", "nat"); err != nil || !strings.Contains(out, "proxy-init/ignore-port-5555") {
		t.Errorf("the namespace's annotation is not in the rules: %v\n%s", err, out)
	}
	if !strings.Contains(r.log.String(), `msg="pod looked up from the kubelet's pods API" node=`+r.node+` pod=`+r.ns+`/static-web uid=uid-static-web command=ADD synced=true`) {
		t.Errorf("the agent did not say the pod came from the kubelet:\n%s", r.log.String())
	}
}
