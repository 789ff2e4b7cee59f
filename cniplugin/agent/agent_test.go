package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/kubetest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
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
		{"a pod only the kubelet knows", testKubeletOnlyPod},
		{"refused and malformed messages", testRefusedMessages},
		{"peers without CAP_SYS_ADMIN in the initial user namespace", testUnprivilegedPeers},
		{"route 1: a forged config is not used", testForgedConfig},
		{"route 1: namespaces refused", testRefusedNamespaces},
		{"route 1: a writer without CAP_SYS_ADMIN", testUnprivilegedWriter},
		{"route 2: an agent that declines", testDeclinedWrites},
		{"both routes: the same CNI codes", testSameCNICodes},
		{"mode legacy", testLegacy},
		{"audit and heal modes", testAudit},
		{"annotations invalid after start", testInvalidAnnotation},
		{"a failed validator is healed in place", testValidatorHealed},
		{"the periodic audit", testPeriodicAudit},
		{"namespaces locked by their pods or on the node", testLockedNamespaces},
		{"annotations edited after start", testAnnotationEdits},
		{"the sweep of what DEL did not remove", testSweep},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, c) })
	}
}

// testCallsThroughSocket: a meshed pod's ADD, CHECK and DEL take the pod from the agent's watch
// (no lookup on the plugin's API path, and no GET by the agent); the agent writes (route 1)
// exactly the node config's rules in the namespace the runtime named, and the record of the pod's
// settings that CHECK and DEL use; the plugin's log lines, the agent's among them, reach its
// stderr and, through its report, the agent's plugin log; the reports become metrics; the DEL
// keeps the agent's audits off the sandbox.
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
	waitFor(t, "the ADD's report", func() bool { return strings.Contains(r.pluginLog.String(), `msg="rules written"`) })
	for where, text := range map[string]string{"stderr": add.stderr, "the agent's plugin log": r.pluginLog.String()} {
		for _, want := range []string{`msg="rules written"`, "cmd=ADD", "pod=web", "namespace=" + r.ns, "container_id=" + p.id, "source=agent api_requests=0 route=agent",
			`msg="pod looked up" cmd=ADD pod=web namespace=` + r.ns + ` container_id=` + p.id + ` writer=agent`} {
			if !strings.Contains(text, want) {
				t.Errorf("%s lacks %s:\n%s", where, want, text)
			}
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
	if _, err := os.Stat(filepath.Join(r.stateDir(), cniplugin.RecordsDir, p.id+".json")); err != nil {
		t.Errorf("no record of the pod's settings after its ADD: %v", err)
	}
	if del := r.run("DEL", r.args(p, r.conf)); del.err != nil {
		t.Errorf("DEL: %v", del.err)
	}
	for _, dir := range []string{cniplugin.RecordsDir, cniplugin.LocksDir} {
		if left, err := os.ReadDir(filepath.Join(r.stateDir(), dir)); err != nil || len(left) > 0 {
			t.Errorf("%s after the DEL: %v %v; want it empty", dir, left, err)
		}
	}
	if st := show(t, p, rs); len(st.Families) > 0 && slices.ContainsFunc(st.Families, func(f iptables.FamilyState) bool { return len(f.Rules) > 0 }) {
		t.Errorf("rules left after DEL: %+v", st)
	}
	// A sandbox the plugin's DEL went through is not audited (its rules are gone on purpose).
	if n := r.a.AuditAll(context.Background()).Audited; n != 0 {
		t.Errorf("audited %d pods after their DEL", n)
	}
	waitFor(t, "the reports", func() bool { return r.metric(`plugin_calls_total{command="DEL",result="ok"}`) == "1" })
	for name, want := range map[string]string{
		`plugin_calls_total{command="ADD",result="ok"}`:      "1",
		`plugin_calls_total{command="CHECK",result="ok"}`:    "1",
		`plugin_calls_total{command="CHECK",result="error"}`: "1",
		`plugin_lookups_total{source="agent"}`:               "3",
		`socket_requests_total{outcome="write"}`:             "1",
		`socket_requests_total{outcome="lookup"}`:            "2",
		`plugin_rules_written_total{route="agent"}`:          "1",
		`socket_requests_total{outcome="del"}`:               "1",
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
	if got := r.metric(`socket_requests_total{outcome="not-seen"}`); got != "1" {
		t.Errorf("not-seen = %q, want 1", got)
	}
	// The plugin's own lines, sent with its report, are in the agent's plugin log.
	if !strings.Contains(r.pluginLog.String(), `msg="rules written"`) || !strings.Contains(r.pluginLog.String(), "source=api api_requests=2") {
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

// testLegacy: in legacy mode the rules are written with iptables-legacy (by the agent here, whose
// PATH holds the binaries; in the DaemonSet its image has none, and it declines), the pod from the
// agent's watch, with no API lookup.
func testLegacy(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{iptablesMode: iptables.ModeLegacy})
	p := r.createPod("legacy", map[string]string{cniplugin.AnnotationSkipOutboundPorts: "3306"}, nil)
	add := r.run("ADD", r.args(p, r.conf))
	if add.err != nil {
		t.Fatalf("ADD: %v\n%s", add.err, add.stderr)
	}
	if len(add.api.Calls()) != 0 || !strings.Contains(add.stderr, "source=agent") {
		t.Errorf("API lookups %v, want none:\n%s", add.api.Calls(), add.stderr)
	}
	expectRules(t, p, expected(t, iptables.ModeLegacy, func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"3306"} }))
}
