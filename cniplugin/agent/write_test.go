package agent_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/wire"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/kubetest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// writeBody is a write request (route 1) for p's pod naming netns as CNI_NETNS.
func (r *rig) writeBody(t *testing.T, name, netns string) []byte {
	t.Helper()
	b, err := json.Marshal(wire.Request{V: wire.WriteVersion, Command: wire.CommandAdd, Namespace: r.ns, Name: name,
		ContainerID: "forged-" + name, Netns: netns, IfName: "eth0"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// openNS opens a namespace's pinned file, to attach it.
func openNS(t *testing.T, ns *nt.NS) *os.File {
	t.Helper()
	f, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// testForgedConfig: the plugin's network config (here with other proxy ports, as a caller would
// forge it) never reaches the agent: a write request cannot carry one, and the agent writes the
// rules of the node's own conflist entry.
func testForgedConfig(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{})
	p := r.createPod("web", nil, nil)
	forged := strings.NewReplacer(`"incoming-proxy-port":4143`, `"incoming-proxy-port":1`, `"outgoing-proxy-port":4140`, `"outgoing-proxy-port":2`).Replace(string(r.conf))
	if forged == string(r.conf) {
		t.Fatal("the config was not forged")
	}
	add := r.run("ADD", r.args(p, []byte(forged)))
	if add.err != nil {
		t.Fatalf("ADD: %v\n%s", add.err, add.stderr)
	}
	if !strings.Contains(add.stderr, "route=agent") {
		t.Errorf("the agent did not write:\n%s", add.stderr)
	}
	expectRules(t, p, expected(t, iptables.ModeNFT, nil))
	if out, err := nt.RunIn(t, p.netns, "iptables-nft-save", "-t", "nat"); err != nil || strings.Contains(out, "--to-ports 1") || strings.Contains(out, "--to-ports 2") {
		t.Errorf("the forged ports were written (%v):\n%s", err, out)
	}
}

// testRefusedNamespaces: a write request whose descriptor is the node's namespace, the agent's own
// (test namespaces stand for both), another pod's than the one pinned at CNI_NETNS, or no
// namespace at all is refused, logged at warning with the peer's PID and counted, and nothing is
// written anywhere; so are a malformed and an oversized write request, which are closed unused. A
// CNI_NETNS the agent cannot check (outside /var/run/netns) is declined with the pod, for the
// plugin to write. The agent keeps serving: writes, and an older plugin's lookup of an ADD.
func testRefusedNamespaces(t *testing.T, c *kubetest.Cluster) {
	host, own := nt.NewNS(t), nt.NewNS(t)
	r := newRig(t, c, rigOpts{hostNetNS: host.Path(), ownNetNS: own.Path()})
	a, b := r.createPod("a", nil, nil), r.createPod("b", nil, nil)
	notNS, err := os.Open("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	defer notNS.Close()
	for _, tc := range []struct {
		name  string
		body  []byte
		fd    *os.File
		code  wire.Code
		want  string
		write bool
	}{
		{"the node's namespace", r.writeBody(t, "a", host.Path()), openNS(t, host), wire.CodeRefused, "the descriptor attached is the node's network namespace (that of its PID 1)", true},
		{"the agent's own namespace", r.writeBody(t, "a", own.Path()), openNS(t, own), wire.CodeRefused, "the descriptor attached is the agent's own network namespace", true},
		{"another namespace than the one pinned at CNI_NETNS", r.writeBody(t, "a", b.netns.Path()), openNS(t, a.netns), wire.CodeRefused,
			"the descriptor attached (nsfs inode ", true},
		{"not a namespace", r.writeBody(t, "a", a.netns.Path()), notNS, wire.CodeRefused, "the descriptor attached: a file, not a namespace", true},
		{"a network config in a write", bytes.Replace(r.writeBody(t, "a", a.netns.Path()), []byte(`"ifName"`), []byte(`"config":{"linkerd":{"incoming-proxy-port":1}},"ifName"`), 1),
			openNS(t, a.netns), wire.CodeMalformed, `json: unknown field "config"`, true},
		{"an oversized write", bytes.Replace(r.writeBody(t, "a", a.netns.Path()), []byte(`"ifName"`), []byte(`"pad":"`+strings.Repeat("x", wire.MaxMessage)+`","ifName"`), 1),
			openNS(t, a.netns), wire.CodeTooLarge, fmt.Sprintf("a message larger than %d bytes", wire.MaxMessage), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := strconv.Atoi(r.metric(`socket_requests_total{outcome="` + string(tc.code) + `"}`))
			reply := sendRaw(t, r.socket, tc.body, int(tc.fd.Fd()))
			if reply.Error == nil || reply.Error.Code != tc.code || !strings.HasPrefix(reply.Error.Message, tc.want) || reply.Written != nil || reply.Pod != nil {
				t.Errorf("reply %+v (error %+v), want %s: %s", reply, reply.Error, tc.code, tc.want)
			}
			if tc.write && reply.V != wire.WriteVersion {
				t.Errorf("the refusal of a write came in version %d, want %d (a plugin would take the agent for one of lookups only)", reply.V, wire.WriteVersion)
			}
			want := fmt.Sprintf(`level=WARN msg="refused a request on the plugin socket; the plugin reads the pod itself" node=%s pid=%d uid=0 code=%s error=`, r.node, os.Getpid(), tc.code)
			if !strings.Contains(r.log.String(), want) {
				t.Errorf("the agent's log lacks %s:\n%s", want, r.log.String())
			}
			if got := r.metric(`socket_requests_total{outcome="` + string(tc.code) + `"}`); got != strconv.Itoa(before+1) {
				t.Errorf("%s = %q, want %d", tc.code, got, before+1)
			}
		})
	}
	// Outside /var/run/netns the agent cannot tell that the runtime pinned the namespace: it
	// declines, with the pod, and writes nothing.
	outside := fmt.Sprintf("/proc/%d/ns/net", os.Getpid())
	reply := sendRaw(t, r.socket, r.writeBody(t, "a", outside), int(openNS(t, a.netns).Fd()))
	if reply.Declined == nil || reply.Declined.Code != wire.CodeCannotWrite || !strings.Contains(reply.Declined.Message, "is not in /var/run/netns") || reply.Pod == nil || reply.Written != nil {
		t.Errorf("a CNI_NETNS outside /var/run/netns: reply %+v (declined %+v), want declined with the pod", reply, reply.Declined)
	}
	for _, ns := range []*nt.NS{host, own, a.netns, b.netns} {
		expectNoneWritten(t, ns)
	}
	if _, err := os.Stat(r.stateDir() + "/" + cniplugin.RecordsDir + "/forged-a.json"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused write left a record: %v", err)
	}

	// Still serving: the plugin's ADD is written by the agent.
	if add := r.run("ADD", r.args(a, r.conf)); add.err != nil || !strings.Contains(add.stderr, "route=agent") {
		t.Errorf("ADD after the refusals: %v\n%s", add.err, add.stderr)
	}
	expectRules(t, a, expected(t, iptables.ModeNFT, nil))
	// A plugin older than writes asks for the pod of an ADD (version 2) and gets it.
	ex, err := wire.Ask(r.socket, 5*time.Second, wire.Request{Command: wire.CommandAdd, Namespace: r.ns, Name: "b", UID: string(b.obj.UID), ContainerID: b.id})
	if err != nil || ex.Reply.V != wire.Version || len(ex.Reply.Pod) == 0 || ex.Reply.Written != nil {
		t.Errorf("an older plugin's lookup: %v, reply %+v", err, ex)
	}
	ex.Report(wire.Report{Command: wire.CommandAdd, Result: "ok", Lookup: "agent", Route: wire.RoutePlugin})
}

// testDeclinedWrites: an agent that cannot write (without the node's /var/run/netns, or as the
// chart's with agent.auditPeriod 0s, which also lacks the node's config and the capabilities)
// says so once, declines every write with the pod (a write request's reply: version 3, why, the
// pod, nothing written), and the plugin writes (route 2) with the agent's copy of the pod: no API
// request, the route in its log line and the agent's metrics.
func testDeclinedWrites(t *testing.T, c *kubetest.Cluster) {
	for _, tc := range []struct {
		name string
		opts rigOpts
		why  string
	}{
		{"no /var/run/netns", rigOpts{noWrites: true}, "the agent has no view of the node's /var/run/netns (--netns-dir; audits are off)"},
		{"agent.auditPeriod 0s", rigOpts{auditsOff: true}, "the agent does not read the node's network config (audits are off: agent.auditPeriod 0s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, c, tc.opts)
			p := r.createPod("web", map[string]string{cniplugin.AnnotationSkipOutboundPorts: "3306"}, nil)
			reply := sendRaw(t, r.socket, r.writeBody(t, "web", p.netns.Path()), int(openNS(t, p.netns).Fd()))
			if d := reply.Declined; reply.V != wire.WriteVersion || d == nil || d.Code != wire.CodeCannotWrite || d.Message != tc.why ||
				len(reply.Pod) == 0 || len(reply.Namespace) == 0 || reply.Written != nil || reply.Error != nil {
				t.Errorf("the reply to a write: %+v (declined %+v), want version %d declined %s: %s, with the pod", reply, d, wire.WriteVersion, wire.CodeCannotWrite, tc.why)
			}
			expectNoneWritten(t, p.netns)
			add := r.run("ADD", r.args(p, r.conf))
			if add.err != nil {
				t.Fatalf("ADD: %v\n%s", add.err, add.stderr)
			}
			if calls := add.api.Calls(); len(calls) != 0 {
				t.Errorf("ADD read %v from the API; want the agent's lookup", calls)
			}
			for _, want := range []string{`msg="the node agent did not write the rules; the plugin writes them"`, `why="node agent: cannot-write: ` + tc.why,
				"source=agent api_requests=0 route=plugin"} {
				if !strings.Contains(add.stderr, want) {
					t.Errorf("the plugin's log lacks %s:\n%s", want, add.stderr)
				}
			}
			expectRules(t, p, expected(t, iptables.ModeNFT, func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"3306"} }))
			if !strings.Contains(r.log.String(), `msg="the agent does not write the plugin's ADDs (route 1); the plugin writes them with the agent's lookups"`) {
				t.Errorf("the agent did not say it does not write:\n%s", r.log.String())
			}
			waitFor(t, "the ADD's report", func() bool { return r.metric(`plugin_rules_written_total{route="plugin"}`) == "1" })
			if got := r.metric(`socket_requests_total{outcome="lookup"}`); got != "2" {
				t.Errorf("lookups = %q, want 2 (the raw write's and the plugin's)", got)
			}
			if got := r.metric(`socket_requests_total{outcome="write"}`); got != "" {
				t.Errorf("writes = %q, want none", got)
			}
		})
	}
}

// testSameCNICodes: an ADD that fails closed (an invalid annotation) fails with the same CNI code
// and message on both routes, writes nothing, and its record is not left behind.
func testSameCNICodes(t *testing.T, c *kubetest.Cluster) {
	var msgs []string
	for _, o := range []rigOpts{{}, {noWrites: true}} {
		r := newRig(t, c, o)
		p := r.createPod("bad", map[string]string{cniplugin.AnnotationSkipOutboundPorts: "not-a-port"}, nil)
		add := r.run("ADD", r.args(p, r.conf))
		var ce *types.Error
		if !errors.As(add.err, &ce) || ce.Code != types.ErrInvalidNetworkConfig {
			t.Fatalf("noWrites=%t: ADD = %v, want CNI code %d\n%s", o.noWrites, add.err, types.ErrInvalidNetworkConfig, add.stderr)
		}
		msgs = append(msgs, strings.ReplaceAll(ce.Msg, r.ns, "NS"))
		expectNoneWritten(t, p.netns)
		if route := map[bool]string{false: "route=agent", true: "failed"}[o.noWrites]; !strings.Contains(add.stderr, route) {
			t.Errorf("noWrites=%t: the log lacks %s:\n%s", o.noWrites, route, add.stderr)
		}
	}
	if msgs[0] != msgs[1] {
		t.Errorf("the routes' errors differ:\nagent:  %s\nplugin: %s", msgs[0], msgs[1])
	}
}

// testUnprivilegedWriter: a write request from a root peer without CAP_SYS_ADMIN is refused in
// the write's version, logged with its PID, and nothing is written in the namespace it attached.
func testUnprivilegedWriter(t *testing.T, c *kubetest.Cluster) {
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv (util-linux) is not installed")
	}
	r := newRig(t, c, rigOpts{})
	p := r.createPod("web", nil, nil)
	cmd := exec.Command("setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--", os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envAsk+"="+r.socket, envAsk+"_POD="+r.ns+"/web", envAsk+"_NETNS="+p.netns.Path())
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, errOut.String())
	}
	want := "node agent: refused: the peer does not hold CAP_SYS_ADMIN (CapEff 0000000000000000), as the plugin the container runtime runs does"
	if got := strings.TrimSpace(out.String()); got != want {
		t.Errorf("the client got %q\nwant %q", got, want)
	}
	if l := `code=refused error="the peer does not hold CAP_SYS_ADMIN`; !strings.Contains(r.log.String(), fmt.Sprintf("pid=%d uid=0 ", cmd.Process.Pid)) || !strings.Contains(r.log.String(), l) {
		t.Errorf("the agent's log lacks the refusal with pid %d:\n%s", cmd.Process.Pid, r.log.String())
	}
	expectNoneWritten(t, p.netns)
}
