package cniplugin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
	"github.com/kubemesh/proxy-init/iptables"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// The node's plugin and the node agent, against a fake agent on a real socket (the real agent is
// tested in cniplugin/agent, and with the real binary in TestCNIWithAgent): what the plugin asks,
// the fallbacks and their log lines, the agent's answer used in place of the API, and the report.

// fakeAgent answers each request with reply (nil: never answers) and records the requests and
// reports it received.
type fakeAgent struct {
	socket  string
	reply   func(wire.Request) []byte
	reqs    chan wire.Request
	reports chan wire.Report
	// writes counts the write requests refused.
	writes atomic.Int32
	// write, when set, answers write requests (an agent that writes); without it the fake is an
	// agent of lookups only, which refuses them.
	write func(wire.Request) wire.Reply
}

func startFakeAgent(t *testing.T, reply func(wire.Request) []byte) *fakeAgent {
	t.Helper()
	return startFake(t, reply, nil)
}

// startFakeWriter starts a fake agent that answers write requests with write.
func startFakeWriter(t *testing.T, write func(wire.Request) wire.Reply) *fakeAgent {
	t.Helper()
	return startFake(t, nil, write)
}

func startFake(t *testing.T, reply func(wire.Request) []byte, write func(wire.Request) wire.Reply) *fakeAgent {
	t.Helper()
	nt.RequireRoot(t, "the plugin talks only to a socket root owns")
	dir, err := os.MkdirTemp("", "fake-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeAgent{socket: filepath.Join(dir, "agent.sock"), reply: reply, write: write,
		reqs: make(chan wire.Request, 8), reports: make(chan wire.Report, 8)}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: f.socket, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go f.serve(conn)
		}
	}()
	return f
}

func (f *fakeAgent) serve(conn *net.UnixConn) {
	defer conn.Close()
	req, fd, err := wire.ReadRequest(conn)
	if err != nil {
		return
	}
	if fd != nil {
		fd.Close()
		if f.write == nil {
			// An agent of lookups only (protocol 2), as before writes: it refuses the descriptor.
			f.writes.Add(1)
			_ = wire.Answer(conn, wire.Reply{Error: wire.Errorf(wire.CodeRefused, "file descriptors attached (protocol 2 carries none); closed unused")})
			return
		}
		if err := wire.Answer(conn, f.write(req)); err != nil {
			return
		}
	} else {
		f.reqs <- req
		if f.reply == nil {
			time.Sleep(time.Minute)
			return
		}
		if _, err := conn.Write(f.reply(req)); err != nil {
			return
		}
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if rep, err := wire.ReadReport(conn); err == nil {
		f.reports <- rep
	}
}

func mustJSONBytes(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// answer is the agent's reply with these objects.
func answer(t *testing.T, pod *Pod, ns *Namespace) func(wire.Request) []byte {
	return func(wire.Request) []byte {
		r := wire.Reply{V: wire.Version, Pod: mustJSONBytes(t, pod)}
		if ns != nil {
			r.Namespace = mustJSONBytes(t, ns)
		}
		return mustJSONBytes(t, r)
	}
}

// refusal is the agent's reply with a typed error.
func refusal(t *testing.T, code wire.Code, msg string) func(wire.Request) []byte {
	return func(wire.Request) []byte {
		return mustJSONBytes(t, wire.Reply{V: wire.Version, Error: &wire.Error{Code: code, Message: msg}})
	}
}

// agentArgs is the policy rig's call with an agent block.
func agentArgs(t *testing.T, r *policyRig, socket, timeout string) *skel.CmdArgs {
	args := r.args(t)
	var conf map[string]any
	if err := json.Unmarshal(args.StdinData, &conf); err != nil {
		t.Fatal(err)
	}
	conf["agent"] = map[string]any{"socket": socket, "timeout": timeout}
	args.StdinData = mustJSONBytes(t, conf)
	return args
}

// nodeRig is the policy rig with the node's plugin: the agent first, then the rig's API.
func nodeRig(t *testing.T, pod *Pod) *policyRig {
	r := newPolicyRig(t, pod)
	p := NewNodePlugin()
	p.Stdout, p.Stderr, p.Runner, p.NewPodAPI = r.plugin.Stdout, r.plugin.Stderr, r.plugin.Runner, r.plugin.NewPodAPI
	r.plugin = p
	return r
}

func TestAgentClientFallsBack(t *testing.T) {
	nt.RequireRoot(t, "the plugin talks only to a socket root owns")
	dir, err := os.MkdirTemp("", "agent-client-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	const warn, info = `level=WARN msg="the node agent did not look the pod up; reading it from the API"`, `level=INFO msg="the node agent did not look the pod up; reading it from the API"`
	tests := []struct {
		name, socket string
		level        string // the log line's start, "" for none above debug
		want         string // the error it names
	}{
		{"no agent on the node", filepath.Join(dir, "absent.sock"), "", ""},
		{"the socket replaced by a regular file", file, warn, `error="` + file + ` is not a socket (mode -rw-------)"`},
		{"a directory others may write", filepath.Join(open, "agent.sock"), warn, `error="` + open + ` is writable by others than root (mode 777)"`},
		{"an agent that never answers", startFakeAgent(t, nil).socket, warn, `error="no answer within 300ms: `},
		{"a garbled answer", startFakeAgent(t, func(wire.Request) []byte { return []byte("nonsense") }).socket, warn,
			`error="the agent's answer: node agent: malformed: invalid character 'o' in literal null (expecting 'u')"`},
		{"another protocol", startFakeAgent(t, func(wire.Request) []byte { return []byte(`{"v":1,"handled":true}`) }).socket, warn,
			`error="the agent's answer: node agent: version: protocol version 1, want 2"`},
		{"a pod the agent has not seen", startFakeAgent(t, refusal(t, wire.CodeNotSeen, "pod web/api-0 is not among the pods of node n1 after 1s")).socket, info,
			`error="node agent: not-seen: pod web/api-0 is not among the pods of node n1 after 1s"`},
		{"an agent that refuses the plugin", startFakeAgent(t, refusal(t, wire.CodeRefused, "the peer does not hold CAP_SYS_ADMIN")).socket, warn,
			`error="node agent: refused: the peer does not hold CAP_SYS_ADMIN"`},
		{"an answer without the namespace", startFakeAgent(t, answer(t, meshedPod(nil, nil), nil)).socket, warn,
			`error="the node agent's answer: its namespace: unexpected end of JSON input"`},
		{"an answer from an unknown source", startFakeAgent(t, func(wire.Request) []byte {
			return mustJSONBytes(t, wire.Reply{V: wire.Version, Pod: mustJSONBytes(t, meshedPod(nil, nil)), Namespace: []byte(`{}`), Source: "moon"})
		}).socket, warn, `error="the node agent's answer: unknown source \"moon\""`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := nodeRig(t, meshedPod(nil, nil))
			start := time.Now()
			err := r.plugin.Add(agentArgs(t, r, tt.socket, "300ms"))
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("ADD took %s, want the fallback within the agent's timeout", took)
			}
			if err != nil {
				t.Fatalf("ADD: %v\n%s", err, r.logs.String())
			}
			if got := r.api.requests; len(got) != 2 {
				t.Errorf("API lookups %v, want the pod and its namespace", got)
			}
			if !strings.Contains(r.fake.Dump(), "PROXY_INIT_OUTPUT") {
				t.Error("no rules written")
			}
			logs := r.logs.String()
			switch {
			case tt.level == "" && strings.Contains(logs, "node agent"):
				t.Errorf("a node without the agent logs about it above debug:\n%s", logs)
			case tt.level != "" && (!strings.Contains(logs, tt.level) || !strings.Contains(logs, tt.want)):
				t.Errorf("log lacks %s with %s:\n%s", tt.level, tt.want, logs)
			case !strings.Contains(logs, "source=api"):
				t.Errorf("log does not say the pod came from the API:\n%s", logs)
			}
		})
	}
}

// TestAgentClientLookup: an agent of lookups only (protocol 2, before writes; the fake agent
// refuses the write request's descriptor as such an agent does) is asked again for the pod; its
// answer replaces the API: the pod's annotation from it is applied with no API request; the
// request carries the pod and nothing else; the report names the agent as the source and carries
// the call's lines.
func TestAgentClientLookup(t *testing.T) {
	pod := meshedPod(nil, map[string]string{AnnotationSkipOutboundPorts: "3306"})
	a := startFakeAgent(t, answer(t, pod, &Namespace{ObjectMeta: ObjectMeta{Name: "web"}}))
	r := nodeRig(t, nil)
	args := agentArgs(t, r, a.socket, "2s")
	args.Args += ";K8S_POD_UID=u-1"
	if err := r.plugin.Add(args); err != nil {
		t.Fatal(err)
	}
	if len(r.api.requests) != 0 {
		t.Errorf("API lookups %v, want the agent's answer", r.api.requests)
	}
	if d := r.fake.Dump(); !strings.Contains(d, "3306") {
		t.Errorf("the pod's annotation from the agent was not applied:\n%s", d)
	}
	if l := r.logs.String(); !strings.Contains(l, "source=agent api_requests=0 route=plugin") ||
		!strings.Contains(l, `msg="the node agent does not write (an older agent, lookups only); asking it for the pod, and the plugin writes"`) {
		t.Errorf("log:\n%s", l)
	}
	if n := a.writes.Load(); n != 1 {
		t.Errorf("%d write requests, want 1 before the lookup", n)
	}
	if req := <-a.reqs; req != (wire.Request{V: wire.Version, Command: "ADD", Namespace: "web", Name: "api-0", UID: "u-1", ContainerID: "c1"}) {
		t.Errorf("request %+v", req)
	}
	select {
	case rep := <-a.reports:
		if rep.Command != "ADD" || rep.Result != "ok" || rep.Lookup != "agent" || rep.Seconds <= 0 || !strings.Contains(rep.Log, `msg="rules written"`) {
			t.Errorf("report %+v", rep)
		}
	case <-time.After(5 * time.Second):
		t.Error("no report")
	}
}

// TestAgentClientLookupWithoutService: the agent's answer without default/kubernetes (its watch
// has not delivered it) makes a control-plane pod skip 443 and 6443, with a warning and no API
// request.
func TestAgentClientLookupWithoutService(t *testing.T) {
	cp := meshedPod(map[string]string{LabelControlPlaneComponent: "destination"}, nil)
	a := startFakeAgent(t, answer(t, cp, &Namespace{ObjectMeta: ObjectMeta{Name: "web"}}))
	r := nodeRig(t, nil)
	if err := r.plugin.Add(agentArgs(t, r, a.socket, "2s")); err != nil {
		t.Fatal(err)
	}
	if len(r.api.requests) != 0 {
		t.Errorf("API lookups %v, want none", r.api.requests)
	}
	if d := r.fake.Dump(); !strings.Contains(d, "443") || !strings.Contains(d, "6443") {
		t.Errorf("the control-plane pod does not skip 443 and 6443:\n%s", d)
	}
	if want := `level=WARN msg="control-plane pod: cannot read the ports of Service default/kubernetes; skipping 443 and 6443"`; !strings.Contains(r.logs.String(), want) ||
		!strings.Contains(r.logs.String(), "service default/kubernetes: not in the node agent's answer") {
		t.Errorf("log lacks %s naming the agent's answer:\n%s", want, r.logs.String())
	}
}

// TestAgentClientDel: DEL tells the agent (its audits must leave the sandbox alone), removes the
// rules itself, and reports.
func TestAgentClientDel(t *testing.T) {
	a := startFakeAgent(t, func(wire.Request) []byte { return mustJSONBytes(t, wire.Reply{V: wire.Version}) })
	r := nodeRig(t, meshedPod(nil, nil))
	args := agentArgs(t, r, a.socket, "2s")
	if err := r.plugin.Add(args); err != nil {
		t.Fatal(err)
	}
	<-a.reqs
	<-a.reports
	if err := r.plugin.Del(args); err != nil {
		t.Fatal(err)
	}
	if req := <-a.reqs; req.Command != "DEL" || req.ContainerID != "c1" {
		t.Errorf("request %+v, want the DEL of c1", req)
	}
	if d := r.fake.Dump(); d != "# ipv4\n# ipv6\n" {
		t.Errorf("rules left after DEL:\n%s", d)
	}
	if rep := <-a.reports; rep.Command != "DEL" || rep.Result != "ok" || rep.Lookup != "none" {
		t.Errorf("report %+v", rep)
	}
}

// TestErrorCodesBothRoutes: a failure has the same CNI error code and message whether the agent
// wrote (route 1: its Written error), the pod came from the agent (route 2) or from the API: an
// invalid annotation is the config's error (7), nothing written; a pod that cannot be looked up
// (the agent has not seen it, the API fails) is "try again later" (11).
func TestErrorCodesBothRoutes(t *testing.T) {
	bad := meshedPod(nil, map[string]string{AnnotationSkipOutboundPorts: "99999"})
	ns := &Namespace{ObjectMeta: ObjectMeta{Name: "web"}}
	byAgent := startFakeAgent(t, answer(t, bad, ns))
	writesBad, writesUnseen := fakeWriter(t, &fakeAPI{pod: bad, ns: ns}), fakeWriter(t, &fakeAPI{err: errors.New("not in the watch")})
	notSeen := startFakeAgent(t, refusal(t, wire.CodeNotSeen, "pod web/api-0 is not among the pods of node n1 after 1s"))
	apiDown := errors.New("dial tcp 192.0.2.1:443: connect: connection refused")
	for _, tc := range []struct {
		name     string
		pod      *Pod
		routes   map[string]string // route: the agent's socket
		wantCode uint
		wantMsg  string
	}{
		{"invalid annotation", bad, map[string]string{"agent writes": writesBad.socket, "agent": byAgent.socket, "api": ""}, types.ErrInvalidNetworkConfig,
			`invalid annotation: annotation config.linkerd.io/skip-outbound-ports="99999" on pod web/api-0: port 99999 is outside 1-65535`},
		{"pod not found", nil, map[string]string{"agent writes, has not seen it, then api": writesUnseen.socket, "agent not seen, then api": notSeen.socket, "api": ""},
			types.ErrTryAgainLater, "pod web/api-0 might be meshed and cannot be looked up (timeout 10s): " + apiDown.Error()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := map[string]string{}
			for route, socket := range tc.routes {
				r := nodeRig(t, tc.pod)
				r.api.ns, r.api.err = ns, apiDown
				err := r.plugin.Add(agentArgs(t, r, socket, "2s"))
				code, msg := cniCode(t, err)
				if code != tc.wantCode || !strings.HasPrefix(msg, tc.wantMsg) {
					t.Errorf("%s: code %d %q, want %d %q", route, code, msg, tc.wantCode, tc.wantMsg)
				}
				if d := r.fake.Dump(); d != "# ipv4\n# ipv6\n" {
					t.Errorf("%s: rules written:\n%s", route, d)
				}
				msgs[route] = msg
			}
			var first string
			for _, m := range msgs {
				if first != "" && m != first {
					t.Errorf("the routes' messages differ: %q", msgs)
				}
				first = m
			}
		})
	}
}

// fakeWriter is an agent that writes (route 1) with the plugin's own AgentAdd, the pod from api,
// the node's config the chart's, into a fake of its own: what the node agent answers a write.
func fakeWriter(t *testing.T, api PodAPI) *fakeAgent {
	conf, err := ParseConfig(withVersion(t, linkerdChartConfig, "1.0.0"))
	if err != nil {
		t.Fatal(err)
	}
	rig := newPolicyRig(t, nil)
	f := startFakeWriter(t, func(req wire.Request) wire.Reply {
		w, err := NewAgentWriter(api, rig.plugin.Runner).AgentAdd(context.Background(), AgentAdd{Conf: conf, ContainerID: req.ContainerID,
			Pod: PodArgs{Namespace: req.Namespace, Name: req.Name, InfraContainerID: req.ContainerID}, NetNS: req.Netns, Log: io.Discard})
		if err != nil && w.Error == nil {
			return wire.Reply{V: wire.WriteVersion, Error: wire.Errorf(wire.CodeNotSeen, "%v", err)}
		}
		return wire.Reply{V: wire.WriteVersion, Written: &w}
	})
	t.Cleanup(func() {
		if d := rig.fake.Dump(); d != "# ipv4\n# ipv6\n" {
			t.Errorf("the agent wrote rules:\n%s", d)
		}
	})
	return f
}

// TestAgentDeclinesForCapability: an agent whose write the kernel refused for want of a capability
// declines with the pod (its capability error crosses intact: TestCapabilityErrorCrosses); the
// plugin writes (route 2) with the agent's pod, no API request, and says why.
func TestAgentDeclinesForCapability(t *testing.T) {
	pod := meshedPod(nil, nil)
	refused := &iptables.CapabilityError{Caps: []string{"CAP_NET_ADMIN"}, NetNS: "net:[4026532281]", Op: "write the iptables-nft nat rules", Err: syscall.EPERM}
	f := startFakeWriter(t, func(wire.Request) wire.Reply {
		return wire.Reply{V: wire.WriteVersion, Pod: mustJSONBytes(t, pod), Namespace: mustJSONBytes(t, &Namespace{}),
			Declined: wire.CapabilityErrorf(refused, "pod web/api-0: %v", refused)}
	})
	r := nodeRig(t, pod)
	if err := r.plugin.Add(agentArgs(t, r, f.socket, "2s")); err != nil {
		t.Fatalf("ADD: %v\n%s", err, r.logs.String())
	}
	if len(r.api.requests) != 0 || !strings.Contains(r.fake.Dump(), "PROXY_INIT_OUTPUT") {
		t.Errorf("API requests %v, rules:\n%s\nwant the plugin's write with the agent's pod", r.api.requests, r.fake.Dump())
	}
	if l := r.logs.String(); !strings.Contains(l, `why="node agent: capability: pod web/api-0: write the iptables-nft nat rules: permission denied`) || !strings.Contains(l, "route=plugin") {
		t.Errorf("the log lacks the decline and the plugin's write:\n%s", l)
	}
}

// kubeletAnswer is the agent's reply with a pod it read from the kubelet and, in place of the
// namespace, why it has none.
func kubeletAnswer(t *testing.T, pod *Pod) func(wire.Request) []byte {
	return func(wire.Request) []byte {
		return mustJSONBytes(t, wire.Reply{V: wire.Version, Pod: mustJSONBytes(t, pod), Source: wire.SourceKubelet,
			NamespaceError: "namespace web: the agent's namespace watch has not synced and the API server did not answer within 1s: connection refused"})
	}
}

// TestAgentClientKubeletSource: a pod the agent read from the kubelet, with no namespace (the API
// server unreachable since the agent started). A pod carrying every annotation is set up from it
// with no API request, and says source=kubelet in its log and report; one that needs its
// namespace fails closed with error 11, naming why, and asks the API nothing.
func TestAgentClientKubeletSource(t *testing.T) {
	every := map[string]string{}
	for _, a := range Annotations {
		every[a] = "1"
	}
	every[AnnotationSkipOutboundPorts] = "3306"
	every[AnnotationSkipSubnets], every[AnnotationSkipInboundSubnets], every[AnnotationSkipOutboundSubnets] = "192.0.2.0/24", "203.0.113.0/24", "198.51.100.0/24"

	t.Run("every annotation on the pod", func(t *testing.T) {
		a := startFakeAgent(t, kubeletAnswer(t, meshedPod(nil, every)))
		r := nodeRig(t, nil)
		if err := r.plugin.Add(agentArgs(t, r, a.socket, "2s")); err != nil {
			t.Fatalf("ADD: %v\n%s", err, r.logs.String())
		}
		if len(r.api.requests) != 0 {
			t.Errorf("API lookups %v, want the agent's answer", r.api.requests)
		}
		if d := r.fake.Dump(); !strings.Contains(d, "3306") {
			t.Errorf("the pod's annotation from the kubelet's answer was not applied:\n%s", d)
		}
		if l := r.logs.String(); !strings.Contains(l, "source=kubelet api_requests=0") {
			t.Errorf("log:\n%s", l)
		}
		select {
		case rep := <-a.reports:
			if rep.Lookup != wire.SourceKubelet || rep.Result != "ok" {
				t.Errorf("report %+v, want lookup kubelet, ok", rep)
			}
		case <-time.After(5 * time.Second):
			t.Error("no report")
		}
	})
	t.Run("a pod that needs its namespace", func(t *testing.T) {
		a := startFakeAgent(t, kubeletAnswer(t, meshedPod(nil, map[string]string{AnnotationSkipOutboundPorts: "3306"})))
		r := nodeRig(t, nil)
		err := r.plugin.Add(agentArgs(t, r, a.socket, "2s"))
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater {
			t.Fatalf("ADD: %v, want CNI error 11\n%s", err, r.logs.String())
		}
		for _, want := range []string{"meshed pod web/api-0: its namespace's annotations cannot be read",
			"the node agent read the pod from the kubelet but has no namespace web to give", "connection refused"} {
			if !strings.Contains(ce.Msg, want) {
				t.Errorf("error lacks %q: %s", want, ce.Msg)
			}
		}
		if len(r.api.requests) != 0 {
			t.Errorf("API lookups %v after the agent's answer, want none", r.api.requests)
		}
		if d := r.fake.Dump(); strings.Contains(d, "PROXY_INIT") {
			t.Errorf("rules written for a pod whose settings are unknown:\n%s", d)
		}
	})
}
