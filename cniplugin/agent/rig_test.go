package agent_test

// The rig: a real kube-apiserver and etcd in a network namespace of the test's own; the agent in
// this process, authenticated as a ServiceAccount bound to the chart's ClusterRole for its mode;
// its socket in a root-only temporary directory; pods' network namespaces created by the test,
// found by a SandboxFinder over them (the CRI's part is sandbox_test.go and make e2e); and the CNI
// plugin's own code in this process (cniplugin.NewNodePlugin), whose API path is a recording
// PodAPI.

import (
	"bytes"
	"context"
	"encoding/json"
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/cnitest"
	"github.com/kubemesh/proxy-init/test/helmchart"
	"github.com/kubemesh/proxy-init/test/kubetest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

const (
	cniNS    = "linkerd-cni"
	waitLong = 30 * time.Second
)

// startCluster runs kube-apiserver and etcd inside a network namespace of the test's own.
func startCluster(t testing.TB) *kubetest.Cluster {
	t.Helper()
	if testing.Short() {
		t.Skip("skipping in -short mode: starts etcd and kube-apiserver (run `make kube-bins` first)")
	}
	nt.RequireRoot(t)
	c := kubetest.Start(t, kubetest.Options{NetNSPath: nt.NewNS(t).Path()})
	if _, err := c.Clientset.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: cniNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c
}

// chartServiceAccount creates the ServiceAccount name with the access the chart rendered with
// values gives linkerd-cni: its ClusterRole's rules in a ClusterRole of its own, and each of its
// Roles, named after it, in the Role's namespace. It returns a token for it.
func chartServiceAccount(t testing.TB, c *kubetest.Cluster, name string, values map[string]any) string {
	t.Helper()
	ch, err := helmchart.Load("../..")
	if err != nil {
		t.Fatal(err)
	}
	files, err := helmchart.Render(ch, values)
	if err != nil {
		t.Fatal(err)
	}
	var rules []rbacv1.PolicyRule
	var roles []*rbacv1.Role
	for _, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(files["10-rbac.yaml"], -1) {
		var obj struct {
			metav1.TypeMeta   `json:",inline"`
			metav1.ObjectMeta `json:"metadata"`
			Rules             []rbacv1.PolicyRule `json:"rules"`
		}
		if yaml.Unmarshal([]byte(doc), &obj) != nil || obj.Name != "linkerd-cni" {
			continue
		}
		switch obj.Kind {
		case "ClusterRole":
			rules = obj.Rules
		case "Role":
			roles = append(roles, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: obj.Namespace}, Rules: obj.Rules})
		}
	}
	if rules == nil || len(roles) == 0 {
		t.Fatal("the chart renders no ClusterRole or no Role linkerd-cni")
	}
	ctx := context.Background()
	token, err := c.ServiceAccountToken(ctx, cniNS, name, name, rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, role := range roles {
		if err := c.BindRole(ctx, role, cniNS, name); err != nil {
			t.Fatal(err)
		}
	}
	return token
}

// serviceAccount creates a ServiceAccount with the chart's access for values and returns a client
// authenticated as it, and its audit-log user name.
func serviceAccount(t testing.TB, c *kubetest.Cluster, name string, values map[string]any) (*kubeclient.Client, string) {
	t.Helper()
	client, err := kubeclient.New(c.ConfigForToken(chartServiceAccount(t, c, name, values)))
	if err != nil {
		t.Fatal(err)
	}
	return client, kubetest.ServiceAccountUser(cniNS, name)
}

// sandboxes is the test's SandboxFinder: the pods' namespaces by UID.
type sandboxes struct {
	mu sync.Mutex
	m  map[string]agent.Sandbox
}

func (s *sandboxes) Find(_ context.Context, uid string) (agent.Sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sb, ok := s.m[uid]
	if !ok {
		return agent.Sandbox{}, agent.ErrNoSandbox
	}
	return sb, nil
}

// Forget does nothing: the test's namespaces are paths, with nothing held.
func (s *sandboxes) Forget(string, string) {}

func (s *sandboxes) add(uid, id, netns string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.m[uid] = agent.Sandbox{ID: id, PodUID: uid, NetNS: netns}
}

type rigOpts struct {
	mode  agent.Mode
	audit time.Duration // the audit period; 0: audits only through AuditAll
	// iptablesMode is the node's network config's (default nft).
	iptablesMode iptables.Mode
	// kubeletPods is the kubelet's pods API socket, if any.
	kubeletPods string
	// noWrites runs the agent without the node's /var/run/netns, so that it declines every write
	// (route 2), as with audits off.
	noWrites bool
	// auditsOff runs the agent as the chart's with agent.auditPeriod 0s: no audits, no sandbox
	// finder, no node config, no /var/run/netns; it declines every write (route 2).
	auditsOff bool
	// ownNetNS and hostNetNS are the stand-ins for the agent's own and the node's namespaces.
	ownNetNS, hostNetNS string
}

// rig is one agent on its own node of the shared cluster.
type rig struct {
	t         testing.TB
	c         *kubetest.Cluster
	admin     kubernetes.Interface
	user      string // the agent's ServiceAccount in the audit log
	node      string
	ns        string // the test's pod namespace
	a         *agent.Agent
	socket    string
	conf      []byte // the plugin's network config (stdin, with prevResult)
	netDir    string
	sandboxes *sandboxes
	log       *cnitest.SyncBuffer
	pluginLog *cnitest.SyncBuffer
}

var rigs atomic.Int64

// newRig starts an agent for a fresh node name and pod namespace on c, with the chart's RBAC for
// its mode. It is stopped at cleanup.
func newRig(t testing.TB, c *kubetest.Cluster, o rigOpts) *rig {
	t.Helper()
	n := rigs.Add(1)
	mode := o.mode
	if mode == "" {
		mode = agent.ModeRepair
	}
	if o.iptablesMode == "" {
		o.iptablesMode = iptables.ModeNFT
	}
	r := &rig{t: t, c: c, admin: c.Clientset, node: fmt.Sprintf("node-%d", n), ns: fmt.Sprintf("app-%d", n),
		sandboxes: &sandboxes{m: map[string]agent.Sandbox{}}, log: &cnitest.SyncBuffer{}, pluginLog: &cnitest.SyncBuffer{}}
	client, user := serviceAccount(t, c, fmt.Sprintf("agent-%d", n), map[string]any{"agent": map[string]any{"mode": string(mode)}})
	r.user = user
	if _, err := r.admin.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: r.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "agent-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	r.socket = filepath.Join(dir, "run", "agent.sock")
	r.netDir = filepath.Join(dir, "net.d")
	if err := os.MkdirAll(r.netDir, 0o755); err != nil {
		t.Fatal(err)
	}
	r.conf = pluginConf(r.socket, o.iptablesMode, true)
	r.writeConflist(o.iptablesMode)

	var out io.Writer = io.MultiWriter(r.log, testWriter{t})
	level := slog.LevelDebug
	if _, bench := t.(*testing.B); bench {
		out, level = r.log, slog.LevelWarn // the figures, not a log of every audit
	}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: level}))
	netnsDir := "/var/run/netns" // where test/netnstest pins the test's namespaces
	if o.noWrites {
		netnsDir = ""
	}
	period := o.audit
	if period == 0 {
		period = time.Hour // tests drive audits with AuditAll and pod events
	}
	opts := agent.Options{NodeName: r.node, Mode: mode, Socket: r.socket, KubeletPodsSocket: o.kubeletPods, HostProc: "/proc", LookupWait: 300 * time.Millisecond,
		AuditPeriod: period, Sandboxes: r.sandboxes, NetConf: &agent.NetConfSource{Dir: r.netDir},
		NetNSDir: netnsDir, OwnNetNS: o.ownNetNS, HostNetNS: o.hostNetNS,
		Log: log, PluginLog: r.pluginLog}
	if o.auditsOff {
		opts.AuditPeriod, opts.Sandboxes, opts.NetConf, opts.NetNSDir = 0, nil, nil, ""
	}
	r.a, err = agent.New(client, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent Run: %v", err)
			}
		case <-time.After(waitLong):
			t.Error("agent did not stop")
		}
	})
	waitFor(t, "the agent to be ready", func() bool { return r.get("/ready") == http.StatusOK })
	return r
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitLong)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *rig) get(path string) int {
	rec := httptest.NewRecorder()
	r.a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code
}

// metric returns a metric's value from /metrics ("" when absent); name may carry labels.
func (r *rig) metric(name string) string {
	rec := httptest.NewRecorder()
	r.a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(agent.MetricsPrefix+name) + ` (\S+)$`).FindStringSubmatch(rec.Body.String())
	if m == nil {
		return ""
	}
	return m[1]
}

// The node's linkerd-cni entry: the chart's defaults, dual-stack.
const linkerdBlock = `{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102,"proxy-gid":-1,
 "ports-to-redirect":[],"inbound-ports-to-ignore":["4191","4190"],"outbound-ports-to-ignore":[],
 "subnets-to-ignore":[],"simulate":false,"use-wait-flag":false,"iptables-mode":%q,"ipv6":true}`

const prevResult = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/x"}],"ips":[{"address":"203.0.113.5/24","interface":0,"gateway":"203.0.113.1"}]}`

// pluginConf is the plugin's stdin as libcni builds it from the node's conflist. The state
// directory (lock files, records) is the socket's, root-only.
func pluginConf(socket string, mode iptables.Mode, withPrev bool) []byte {
	prev := ""
	if withPrev {
		prev = `,"prevResult":` + prevResult
	}
	return []byte(fmt.Sprintf(`{"cniVersion":"1.0.0","name":"k8s-pod-network","type":"linkerd-cni","log_level":"debug",
 "state-dir":%q,"agent":{"socket":%q,"timeout":"2s"},"kubernetes":{"kubeconfig":"/nonexistent"},"linkerd":`+linkerdBlock+prev+`}`, filepath.Dir(socket), socket, mode))
}

func (r *rig) writeConflist(mode iptables.Mode) {
	list := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"bridge","bridge":"cni0"},
 {"type":"linkerd-cni","log_level":"debug","state-dir":%q,"agent":{"socket":%q},"kubernetes":{"kubeconfig":"/nonexistent"},"linkerd":`+linkerdBlock+`}]}`, filepath.Dir(r.socket), r.socket, mode)
	if err := os.WriteFile(filepath.Join(r.netDir, "10-bridge.conflist"), []byte(list), 0o644); err != nil {
		r.t.Fatal(err)
	}
}

// rules are the rules a pod should hold, and the backend that reads them.
type rules struct {
	rs   *iptables.Ruleset
	mode iptables.Mode
}

// expected is the node's config's rules, before annotations.
func expected(t testing.TB, mode iptables.Mode, edit func(*iptables.Config)) rules {
	t.Helper()
	cfg := iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1,
		InboundPortsToIgnore: []string{"4191", "4190"}, IPv6: true, Mode: mode}
	if edit != nil {
		edit(&cfg)
	}
	rs, err := iptables.Build(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rules{rs, mode}
}

func (w rules) target(p *pod) runner.Target {
	return runner.Target{NetNS: p.netns.Path(), Options: runner.Options{Mode: w.mode}}
}

// pod is a test pod: its API object and its network namespace.
type pod struct {
	obj   *corev1.Pod
	netns *nt.NS
	id    string // the sandbox ID
}

// createPod creates a meshed pod on the rig's node, reports it running as a kubelet would, and
// gives it a network namespace; the sandbox finder knows it once the test calls started, as the
// CRI lists a sandbox only after its ADD.
func (r *rig) createPod(name string, annotations map[string]string, edit func(*corev1.Pod)) *pod {
	r.t.Helper()
	ctx := context.Background()
	obj := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: r.ns, Annotations: annotations,
			Labels: map[string]string{agent.ControlPlaneNSLabel: "linkerd"}},
		Spec: corev1.PodSpec{NodeName: r.node,
			InitContainers: []corev1.Container{{Name: agent.ValidatorContainer, Image: "proxy-init:test"}},
			Containers:     []corev1.Container{{Name: "app", Image: "app:test"}, {Name: cniplugin.ProxyContainerName, Image: "proxy:test"}}},
	}
	if edit != nil {
		edit(obj)
	}
	created, err := r.admin.CoreV1().Pods(r.ns).Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		r.t.Fatalf("create pod %s: %v", name, err)
	}
	created.Status.Phase = corev1.PodRunning
	created.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReadyToStartContainers, Status: corev1.ConditionTrue}}
	if created, err = r.admin.CoreV1().Pods(r.ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		r.t.Fatal(err)
	}
	return &pod{obj: created, netns: nt.NewNS(r.t), id: "sandbox-" + name + "-" + string(created.UID)[:8]}
}

// started makes p's sandbox known to the agent's finder.
func (r *rig) started(p *pod) { r.sandboxes.add(string(p.obj.UID), p.id, p.netns.Path()) }

// args are the CNI arguments containerd passes for p.
func (r *rig) args(p *pod, conf []byte) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: p.id, Netns: p.netns.Path(), IfName: "eth0", Path: "/opt/cni/bin",
		Args:      fmt.Sprintf("IgnoreUnknown=1;K8S_POD_NAMESPACE=%s;K8S_POD_NAME=%s;K8S_POD_INFRA_CONTAINER_ID=%s;K8S_POD_UID=%s", p.obj.Namespace, p.obj.Name, p.id, p.obj.UID),
		StdinData: conf}
}

// call is one in-process plugin call.
type call struct {
	stdout, stderr string
	err            error
	api            *recordingAPI
	took           time.Duration
}

// run calls the plugin's command through its CNI table, as skel does; its API path reads from the
// cluster as admin and records every lookup.
func (r *rig) run(cmd string, args *skel.CmdArgs) call {
	r.t.Helper()
	var out, errOut bytes.Buffer
	api := &recordingAPI{cs: r.admin}
	p := cniplugin.NewNodePlugin()
	p.Stdout, p.Stderr = &out, &errOut
	p.NewPodAPI = func(*cniplugin.NetConf) (cniplugin.PodAPI, error) { return api, nil }
	f := p.Funcs()
	start := time.Now()
	var err error
	switch cmd {
	case "ADD":
		err = f.Add(args)
	case "CHECK":
		err = f.Check(args)
	case "DEL":
		err = f.Del(args)
	}
	return call{stdout: out.String(), stderr: errOut.String(), err: err, api: api, took: time.Since(start)}
}

// recordingAPI is the plugin's API path for the tests: the cluster, read as admin, each lookup
// recorded.
type recordingAPI struct {
	cs kubernetes.Interface
	callLog
}

// callLog records the calls a test double answers, for concurrent callers.
type callLog struct {
	mu    sync.Mutex
	calls []string
}

func (l *callLog) record(s string) {
	l.mu.Lock()
	l.calls = append(l.calls, s)
	l.mu.Unlock()
}

// Calls returns the calls so far, in order.
func (l *callLog) Calls() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.calls...)
}

func (a *recordingAPI) Pod(ctx context.Context, namespace, name string) (*cniplugin.Pod, error) {
	a.record("pod " + namespace + "/" + name)
	p, err := a.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out cniplugin.Pod
	return &out, recode(p, &out)
}

func (a *recordingAPI) Namespace(ctx context.Context, name string) (*cniplugin.Namespace, error) {
	a.record("namespace " + name)
	n, err := a.cs.CoreV1().Namespaces().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out cniplugin.Namespace
	return &out, recode(n, &out)
}

func (a *recordingAPI) Service(ctx context.Context, namespace, name string) (*cniplugin.Service, error) {
	a.record("service " + namespace + "/" + name)
	s, err := a.cs.CoreV1().Services(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var out cniplugin.Service
	return &out, recode(s, &out)
}

func recode(from, into any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}

// show reads p's rules against w with w's backend.
func show(t testing.TB, p *pod, w rules) iptables.State {
	t.Helper()
	st, err := runner.Runner{}.Show(context.Background(), w.target(p), w.rs)
	if err != nil {
		t.Fatalf("read the rules of %s: %v", p.obj.Name, err)
	}
	return st
}

func apply(t testing.TB, p *pod, w rules) {
	t.Helper()
	if _, err := (runner.Runner{}).Apply(context.Background(), w.target(p), w.rs); err != nil {
		t.Fatal(err)
	}
}

func expectRules(t testing.TB, p *pod, w rules) {
	t.Helper()
	if st := show(t, p, w); !st.Match() || len(st.Families) == 0 {
		t.Errorf("rules of %s differ from the expected ones: %+v", p.obj.Name, st)
	}
}

// events returns the Events regarding p.
func (r *rig) events(p *pod) []string {
	r.t.Helper()
	evs, err := r.admin.EventsV1().Events(r.ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	var out []string
	for _, e := range evs.Items {
		if e.Regarding.UID == p.obj.UID {
			out = append(out, e.Type+" "+e.Reason+" "+e.Action+": "+e.Note)
		}
	}
	return out
}

func (r *rig) podExists(p *pod) bool {
	r.t.Helper()
	got, err := r.admin.CoreV1().Pods(r.ns).Get(context.Background(), p.obj.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return false
	}
	if err != nil {
		r.t.Fatal(err)
	}
	return got.UID == p.obj.UID && got.DeletionTimestamp == nil
}
