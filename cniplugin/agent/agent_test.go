package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/internal/kubetest"
	nt "github.com/kubemesh/proxy-init/internal/netnstest"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/backend"
	"github.com/kubemesh/proxy-init/iptables/iptablestest"
)

// TestAgent runs every scenario against one kube-apiserver, each with an agent of its own (a node
// of its own).
func TestAgent(t *testing.T) {
	c := startCluster(t)
	for _, tc := range []struct {
		name string
		run  func(*testing.T, *kubetest.Cluster)
	}{
		{"calls through the socket", testCallsThroughSocket},
		{"a pod of another node", testOtherNode},
		{"a pod the watch delivers during the wait", testLateP},
		{"malformed requests", testMalformedRequests},
		{"mode legacy: the agent looks up, the plugin writes", testLookupOnly},
		{"a write that fails in the agent", testAgentWriteFails},
		{"audit and heal modes", testAudit},
		{"annotations invalid after start", testInvalidAnnotation},
		{"a failed validator is healed in place", testValidatorHealed},
		{"the periodic audit", testPeriodicAudit},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, c) })
	}
}

// testCallsThroughSocket: a meshed pod's ADD, CHECK and DEL are run by the agent, with the pod from
// its watch (no lookup on the plugin's API path, and no GET by the agent), the rules written in
// the namespace the plugin passed; its log lines reach both the plugin's stderr and the agent's
// plugin log, naming the runtime's netns path; the plugin's reports become metrics.
func testCallsThroughSocket(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{})
	p := r.createPod("web", nil, nil)
	rs := expected(t, iptables.ModeNFT, nil)

	add := r.run("ADD", r.args(p, r.conf))
	if add.err != nil {
		t.Fatalf("ADD: %v\n%s", add.err, add.stderr)
	}
	if calls := add.api.Calls(); len(calls) != 0 {
		t.Errorf("ADD read %v from the API; want the agent's watch", calls)
	}
	var prev, got any
	_ = json.Unmarshal([]byte(prevResult), &prev)
	if err := json.Unmarshal([]byte(add.stdout), &got); err != nil || fmt.Sprint(got) != fmt.Sprint(prev) {
		t.Errorf("ADD printed %q, want prevResult", add.stdout)
	}
	expectRules(t, p, rs)
	for where, text := range map[string]string{"stderr": add.stderr, "the agent's plugin log": r.pluginLog.String()} {
		for _, want := range []string{`msg="rules written"`, "cmd=ADD", "pod=web", "namespace=" + r.ns, "containerID=" + p.id, "apiRequests=0"} {
			if !strings.Contains(text, want) {
				t.Errorf("%s lacks %s:\n%s", where, want, text)
			}
		}
		if strings.Contains(text, "/proc/self/fd/") {
			t.Errorf("%s names the agent's descriptor instead of the runtime's netns path:\n%s", where, text)
		}
	}

	r.started(p)
	if chk := r.run("CHECK", r.args(p, r.conf)); chk.err != nil {
		t.Errorf("CHECK: %v\n%s", chk.err, chk.stderr)
	}
	// CHECK names a difference, and the runtime's path.
	if _, err := nt.RunIn(t, p.netns, "iptables-nft", "-t", "nat", "-D", "PROXY_INIT_OUTPUT", "1"); err != nil {
		t.Fatal(err)
	}
	chk := r.run("CHECK", r.args(p, r.conf))
	var ce *types.Error
	if !errors.As(chk.err, &ce) || !strings.Contains(ce.Msg, "missing") || !strings.Contains(ce.Msg, p.netns.Path()) {
		t.Errorf("CHECK after a rule was deleted: %v; want the missing rule and %s", chk.err, p.netns.Path())
	}
	if del := r.run("DEL", r.args(p, r.conf)); del.err != nil {
		t.Errorf("DEL: %v", del.err)
	}
	if st := show(t, p, rs); len(st.Families) > 0 && slices.ContainsFunc(st.Families, func(f iptables.FamilyState) bool { return len(f.Rules) > 0 }) {
		t.Errorf("rules left after DEL: %+v", st)
	}
	// A sandbox the plugin's DEL went through is not audited (its rules are gone on purpose).
	if n := r.a.AuditAll(context.Background()); n != 0 {
		t.Errorf("audited %d pods after their DEL", n)
	}
	waitFor(t, "the reports", func() bool { return r.metric(`plugin_calls_total{command="DEL",result="ok"}`) == "1" })
	for name, want := range map[string]string{
		`plugin_calls_total{command="ADD",result="ok"}`:      "1",
		`plugin_calls_total{command="CHECK",result="ok"}`:    "1",
		`plugin_calls_total{command="CHECK",result="error"}`: "1",
		`plugin_lookups_total{source="agent"}`:               "3",
		`socket_requests_total{outcome="handled"}`:           "4",
		`plugin_call_duration_seconds_count{command="ADD"}`:  "1",
	} {
		if got := r.metric(name); got != want {
			t.Errorf("%s = %q, want %s", name, got, want)
		}
	}
	// The agent asked the API nothing but its watches.
	evs, err := c.AuditEvents(r.user)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		if e.Verb != "list" && e.Verb != "watch" {
			t.Errorf("agent request %s %s", e.Verb, e.RequestURI)
		}
	}
}

// testOtherNode: the agent answers only for pods of its node: one of another node makes the
// plugin read the API, and say why.
func testOtherNode(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{})
	p := r.createPod("elsewhere", nil, func(p *corev1.Pod) { p.Spec.NodeName = "some-other-node" })
	add := r.run("ADD", r.args(p, r.conf))
	if add.err != nil {
		t.Fatalf("ADD: %v\n%s", add.err, add.stderr)
	}
	if calls := add.api.Calls(); !slices.Contains(calls, "pod "+r.ns+"/elsewhere") {
		t.Errorf("the plugin's API lookups %v; want the pod read from the API", calls)
	}
	if want := "is not among the pods of node " + r.node; !strings.Contains(add.stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, add.stderr)
	}
	expectRules(t, p, expected(t, iptables.ModeNFT, nil))
	waitFor(t, "the report", func() bool { return r.metric(`plugin_lookups_total{source="api"}`) == "1" })
	if got := r.metric(`socket_requests_total{outcome="fallback"}`); got != "1" {
		t.Errorf("fallbacks = %q, want 1", got)
	}
	// The plugin's own lines, sent with its report, are in the agent's plugin log.
	if !strings.Contains(r.pluginLog.String(), `msg="rules written"`) || !strings.Contains(r.pluginLog.String(), "apiRequests=") {
		t.Errorf("the agent's plugin log lacks the plugin's lines:\n%s", r.pluginLog.String())
	}
}

// testLateP: a pod the agent's watch delivers while a call waits for it is served by the agent.
func testLateP(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{})
	// The call arrives first: create the pod 100ms into the agent's 300ms wait.
	ns := nt.NewNS(t)
	args := &pod{obj: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "late", Namespace: r.ns}}, netns: ns, id: "sandbox-late"}
	done := make(chan call, 1)
	go func() {
		a := r.args(args, r.conf)
		a.Args = fmt.Sprintf("K8S_POD_NAMESPACE=%s;K8S_POD_NAME=late", r.ns) // no UID: the name decides
		done <- r.run("ADD", a)
	}()
	time.Sleep(100 * time.Millisecond)
	r.createPod("late", nil, nil)
	add := <-done
	if add.err != nil || len(add.api.Calls()) != 0 {
		t.Fatalf("ADD = %v, API lookups %v; want the agent to serve it\n%s", add.err, add.api.Calls(), add.stderr)
	}
	expectRules(t, args, expected(t, iptables.ModeNFT, nil))
}

// testMalformedRequests: each bad request is logged and answered with a refusal; the agent keeps
// serving.
func testMalformedRequests(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{})
	good := func(cmd string) []byte {
		b, _ := json.Marshal(cniplugin.AgentRequest{V: cniplugin.AgentProtocol, Command: cmd, ContainerID: "x",
			Args: "K8S_POD_NAMESPACE=a;K8S_POD_NAME=b", Config: r.conf})
		return b
	}
	netns, err := os.Open(nt.NewNS(t).Path())
	if err != nil {
		t.Fatal(err)
	}
	defer netns.Close()
	for _, tc := range []struct {
		name string
		body []byte
		fds  []int
		want string
	}{
		{"not JSON", []byte("GET / HTTP/1.1\r\n"), nil, "malformed request: invalid character"},
		{"another protocol version", []byte(`{"v":7,"command":"ADD","config":{}}`), nil, "malformed request: protocol version 7, want 1"},
		{"unknown command", good("VERSION"), nil, `malformed request: command "VERSION", want ADD, CHECK or DEL`},
		{"a descriptor it does not announce", good("ADD"), []int{int(netns.Fd())}, "malformed request: 1 file descriptors attached, netnsFD is false"},
		{"no config", []byte(`{"v":1,"command":"DEL"}`), nil, "malformed request: no config"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("unixpacket", r.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			uc := conn.(*net.UnixConn)
			var oob []byte
			if tc.fds != nil {
				oob = syscall.UnixRights(tc.fds...)
			}
			if _, _, err := uc.WriteMsgUnix(tc.body, oob, nil); err != nil {
				t.Fatal(err)
			}
			_ = uc.SetReadDeadline(time.Now().Add(5 * time.Second))
			buf := make([]byte, cniplugin.MaxAgentMessage)
			n, err := uc.Read(buf)
			if err != nil {
				t.Fatalf("no reply: %v", err)
			}
			var reply cniplugin.AgentReply
			if err := json.Unmarshal(buf[:n], &reply); err != nil || reply.Handled || !strings.HasPrefix(reply.Reason, tc.want) {
				t.Errorf("reply %s, want not handled, reason %q", buf[:n], tc.want)
			}
		})
	}
	if !strings.Contains(r.log.String(), "malformed request; told the plugin to do the call itself") {
		t.Errorf("the agent did not log the malformed requests:\n%s", r.log.String())
	}
	if got := r.metric(`socket_requests_total{outcome="malformed"}`); got != "5" {
		t.Errorf("malformed = %q, want 5", got)
	}
	// Still serving.
	p := r.createPod("after", nil, nil)
	if add := r.run("ADD", r.args(p, r.conf)); add.err != nil || len(add.api.Calls()) != 0 {
		t.Errorf("ADD after the bad requests: %v, API lookups %v", add.err, add.api.Calls())
	}
}

// testLookupOnly: in legacy mode the agent's image has no binaries to write with: it sends the
// pod, and the plugin writes with the node's iptables-legacy, still with no API lookup.
func testLookupOnly(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{iptablesMode: iptables.ModeLegacy})
	p := r.createPod("legacy", map[string]string{cniplugin.AnnotationSkipOutboundPorts: "3306"}, nil)
	add := r.run("ADD", r.args(p, r.conf))
	if add.err != nil {
		t.Fatalf("ADD: %v\n%s", add.err, add.stderr)
	}
	if len(add.api.Calls()) != 0 {
		t.Errorf("API lookups %v, want none", add.api.Calls())
	}
	for _, want := range []string{`msg="the node agent looked the pod up; the plugin does the rest"`, `why="iptables-mode \"legacy\" is written by the node's iptables binaries"`} {
		if !strings.Contains(add.stderr, want) {
			t.Errorf("stderr lacks %s:\n%s", want, add.stderr)
		}
	}
	expectRules(t, p, expected(t, iptables.ModeLegacy, func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"3306"} }))
	waitFor(t, "the report", func() bool { return r.metric(`socket_requests_total{outcome="lookup"}`) == "1" })
	if got := r.metric(`plugin_lookups_total{source="agent"}`); got != "1" {
		t.Errorf("agent lookups = %q, want 1", got)
	}
}

// failing is an applier that refuses every write, as a kernel that needs binaries the agent's
// image lacks would.
type failing struct{ iptables.Applier }

func (failing) Name() string { return "refusing" }
func (failing) Apply(context.Context, *iptables.Ruleset) (iptables.Result, error) {
	return iptables.Result{}, errors.New("iptables-nft-restore not found in PATH")
}

// testAgentWriteFails: when the agent cannot write the rules, the plugin writes them itself with
// the agent's lookup, and ADD succeeds.
func testAgentWriteFails(t *testing.T, c *kubetest.Cluster) {
	refuse := backend.Runner{Choose: func(backend.Options) (iptables.Applier, string, error) {
		return failing{iptablestest.NewFake()}, "a test asks for it", nil
	}, Others: func([]iptables.Backend) []iptables.Applier { return nil }}
	r := newRig(t, c, rigOpts{runner: refuse})
	p := r.createPod("refused", nil, nil)
	add := r.run("ADD", r.args(p, r.conf))
	if add.err != nil {
		t.Fatalf("ADD: %v\n%s", add.err, add.stderr)
	}
	if len(add.api.Calls()) != 0 {
		t.Errorf("API lookups %v, want none", add.api.Calls())
	}
	if want := "the agent could not do it: pod " + r.ns + "/refused, netns " + p.netns.Path() + ": apply rules with refusing: iptables-nft-restore not found"; !strings.Contains(add.stderr, want) {
		t.Errorf("stderr lacks %q:\n%s", want, add.stderr)
	}
	expectRules(t, p, expected(t, iptables.ModeNFT, nil))
}
