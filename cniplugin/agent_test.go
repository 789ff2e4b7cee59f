package cniplugin

import (
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	nt "github.com/kubemesh/proxy-init/internal/netnstest"
)

// The plugin's side of the node agent, against a fake agent on a real socket (the real agent is
// tested in cniplugin/agent, and with the real binary in TestCNI): the fallbacks, the bound on a
// slow agent, and that a handled answer is final.

// fakeAgent answers each request with reply (nil: never answers) and records what it received.
type fakeAgent struct {
	socket  string
	reply   func(AgentRequest) []byte
	reqs    chan AgentRequest
	fdInos  chan uint64
	reports chan AgentReport
}

func startFakeAgent(t *testing.T, reply func(AgentRequest) []byte) *fakeAgent {
	t.Helper()
	nt.RequireRoot(t, "the plugin talks only to a socket root owns")
	dir, err := os.MkdirTemp("", "fake-agent-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	f := &fakeAgent{socket: filepath.Join(dir, "agent.sock"), reply: reply,
		reqs: make(chan AgentRequest, 8), fdInos: make(chan uint64, 8), reports: make(chan AgentReport, 8)}
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
	buf, oob := make([]byte, MaxAgentMessage), make([]byte, 64)
	n, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return
	}
	var req AgentRequest
	_ = json.Unmarshal(buf[:n], &req)
	f.reqs <- req
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			fds, _ := unix.ParseUnixRights(&m)
			for _, fd := range fds {
				var st unix.Stat_t
				_ = unix.Fstat(fd, &st)
				f.fdInos <- st.Ino
				unix.Close(fd)
			}
		}
	}
	if f.reply == nil {
		time.Sleep(time.Minute)
		return
	}
	if _, err := conn.Write(f.reply(req)); err != nil {
		return
	}
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err = conn.Read(buf); err == nil {
		var rep AgentReport
		if json.Unmarshal(buf[:n], &rep) == nil {
			f.reports <- rep
		}
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

// agentArgs is the policy rig's call with an agent block.
func agentArgs(t *testing.T, r *policyRig, socket, timeout, logFile string) *skel.CmdArgs {
	args := r.args(t)
	var conf map[string]any
	if err := json.Unmarshal(args.StdinData, &conf); err != nil {
		t.Fatal(err)
	}
	conf["agent"] = map[string]any{"socket": socket, "timeout": timeout}
	if logFile != "" {
		conf["log_file"] = logFile
	}
	args.StdinData = mustJSONBytes(t, conf)
	return args
}

// viaAgentRig is the policy rig with the agent client on.
func viaAgentRig(t *testing.T) *policyRig {
	r := newPolicyRig(t, meshedPod(nil, nil))
	r.plugin.AskAgent = true
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
	slow := startFakeAgent(t, nil)
	garbled := startFakeAgent(t, func(AgentRequest) []byte { return []byte("nonsense") })
	oldProtocol := startFakeAgent(t, func(AgentRequest) []byte { return []byte(`{"v":0,"handled":true}`) })
	tests := []struct {
		name, socket string
		want         string // the warning naming the socket; "" for none
		maxTook      time.Duration
	}{
		{"no agent on the node", filepath.Join(dir, "absent.sock"), "", time.Second},
		{"the socket replaced by a regular file", file, `socket=` + file + ` error="` + file + ` is not a socket but a regular file"`, time.Second},
		{"a directory others may write", filepath.Join(open, "agent.sock"), `error="` + open + ` is writable by others than root (mode 777)"`, time.Second},
		{"an agent that never answers", slow.socket, `error="no answer within 300ms: `, 2 * time.Second},
		{"a garbled answer", garbled.socket, `error="malformed answer: invalid character`, time.Second},
		{"another protocol", oldProtocol.socket, `error="the agent speaks protocol version 0, the plugin 1"`, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := viaAgentRig(t)
			start := time.Now()
			err := r.plugin.Funcs().Add(agentArgs(t, r, tt.socket, "300ms", ""))
			took := time.Since(start)
			if err != nil {
				t.Fatalf("ADD: %v\n%s", err, r.logs.String())
			}
			if took > tt.maxTook {
				t.Errorf("ADD took %s, want the fallback within %s", took, tt.maxTook)
			}
			if got := r.api.requests; len(got) != 2 {
				t.Errorf("API lookups %v, want the pod and its namespace", got)
			}
			if !strings.Contains(r.fake.Dump(), "PROXY_INIT_OUTPUT") {
				t.Error("no rules written")
			}
			logs := r.logs.String()
			switch {
			case tt.want == "" && strings.Contains(logs, "node agent not used"):
				t.Errorf("a node without the agent logs about it at info:\n%s", logs)
			case tt.want != "" && (!strings.Contains(logs, `level=WARN msg="node agent not used; doing the call here"`) || !strings.Contains(logs, tt.want)):
				t.Errorf("log lacks the warning with %s:\n%s", tt.want, logs)
			}
		})
	}
}

func TestAgentClientHandled(t *testing.T) {
	prev := prevResults["1.0.0"]
	ok := startFakeAgent(t, func(AgentRequest) []byte {
		return []byte(`{"v":1,"handled":true,"result":` + prev + `,"log":"level=INFO msg=\"rules written\" by=agent\n"}`)
	})
	refused := startFakeAgent(t, func(AgentRequest) []byte {
		return []byte(`{"v":1,"handled":true,"error":{"code":7,"msg":"invalid annotation: config.linkerd.io/skip-outbound-ports"},"log":"level=ERROR msg=failed\n"}`)
	})

	t.Run("the agent's result and lines, and the namespace passed", func(t *testing.T) {
		r := viaAgentRig(t)
		logFile := filepath.Join(t.TempDir(), "plugin.log")
		args := agentArgs(t, r, ok.socket, "2s", logFile)
		if err := r.plugin.Funcs().Add(args); err != nil {
			t.Fatal(err)
		}
		jsonEqual(t, r.out.String(), prev)
		if len(r.api.requests) != 0 || r.fake.Dump() != "# ipv4\n# ipv6\n" {
			t.Errorf("the plugin did the call itself too: lookups %v, rules %s", r.api.requests, r.fake.Dump())
		}
		b, _ := os.ReadFile(logFile)
		for where, text := range map[string]string{"stderr": r.logs.String(), "log_file": string(b)} {
			if !strings.Contains(text, `msg="rules written" by=agent`) {
				t.Errorf("%s lacks the agent's line:\n%s", where, text)
			}
		}
		req := <-ok.reqs
		if req.Command != "ADD" || req.ContainerID != "c1" || req.Netns != args.Netns || !req.NetnsFD || string(req.Config) != string(args.StdinData) {
			t.Errorf("request %+v", req)
		}
		var st syscall.Stat_t
		if err := syscall.Stat(args.Netns, &st); err != nil {
			t.Fatal(err)
		}
		if ino := <-ok.fdInos; ino != st.Ino {
			t.Errorf("descriptor passed is inode %d, the netns %d", ino, st.Ino)
		}
		select {
		case rep := <-ok.reports:
			if rep.Command != "ADD" || rep.Result != "ok" || rep.Lookup != "agent" || rep.Seconds <= 0 {
				t.Errorf("report %+v", rep)
			}
		case <-time.After(5 * time.Second):
			t.Error("no report")
		}
	})

	t.Run("a handled failure is final", func(t *testing.T) {
		r := viaAgentRig(t)
		err := r.plugin.Funcs().Add(agentArgs(t, r, refused.socket, "2s", ""))
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != types.ErrInvalidNetworkConfig || ce.Msg != "invalid annotation: config.linkerd.io/skip-outbound-ports" {
			t.Errorf("ADD = %v, want the agent's error", err)
		}
		if r.out.Len() != 0 || len(r.api.requests) != 0 || r.fake.Dump() != "# ipv4\n# ipv6\n" {
			t.Errorf("after the agent's failure: stdout %q, lookups %v, rules %s", r.out.String(), r.api.requests, r.fake.Dump())
		}
		if rep := <-refused.reports; rep.Result != "error" {
			t.Errorf("report %+v", rep)
		}
	})
}

func TestAgentClientLookupOnly(t *testing.T) {
	pod := mustJSONBytes(t, meshedPod(nil, map[string]string{AnnotationSkipOutboundPorts: "3306"}))
	a := startFakeAgent(t, func(AgentRequest) []byte {
		return mustJSONBytes(t, AgentReply{V: 1, Reason: "a test", Lookup: &AgentLookup{Pod: pod, Namespace: []byte(`{"metadata":{"name":"web"}}`)}})
	})
	r := viaAgentRig(t)
	if err := r.plugin.Funcs().Add(agentArgs(t, r, a.socket, "2s", "")); err != nil {
		t.Fatal(err)
	}
	if len(r.api.requests) != 0 {
		t.Errorf("API lookups %v, want the agent's answer", r.api.requests)
	}
	if d := r.fake.Dump(); !strings.Contains(d, "--dport 3306") && !strings.Contains(d, "3306") {
		t.Errorf("the pod's annotation from the agent was not applied:\n%s", d)
	}
	if !strings.Contains(r.logs.String(), "apiRequests=0") {
		t.Errorf("log:\n%s", r.logs.String())
	}
	if rep := <-a.reports; rep.Lookup != "agent" || rep.Result != "ok" || !strings.Contains(rep.Log, `msg="rules written"`) {
		t.Errorf("report %+v", rep)
	}
}

// TestAgentClientLookupWithoutService: the agent's answer without default/kubernetes (its watch
// has not delivered it) makes a control-plane pod skip 443 and 6443, with a warning and no API
// request, as when the agent writes the rules itself; an answer with the pod but not its
// namespace is no answer, and the plugin reads both from the API.
func TestAgentClientLookupWithoutService(t *testing.T) {
	cp := mustJSONBytes(t, meshedPod(map[string]string{LabelControlPlaneComponent: "destination"}, nil))
	nsJSON := []byte(`{"metadata":{"name":"web"}}`)
	noService := startFakeAgent(t, func(AgentRequest) []byte {
		return mustJSONBytes(t, AgentReply{V: 1, Reason: "a test", Lookup: &AgentLookup{Pod: cp, Namespace: nsJSON}})
	})
	half := startFakeAgent(t, func(AgentRequest) []byte {
		return mustJSONBytes(t, AgentReply{V: 1, Reason: "a test", Lookup: &AgentLookup{Pod: cp}})
	})

	r := viaAgentRig(t)
	if err := r.plugin.Funcs().Add(agentArgs(t, r, noService.socket, "2s", "")); err != nil {
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

	r = viaAgentRig(t)
	if err := r.plugin.Funcs().Add(agentArgs(t, r, half.socket, "2s", "")); err != nil {
		t.Fatal(err)
	}
	if got := r.api.requests; len(got) != 2 {
		t.Errorf("API lookups %v, want the pod and its namespace", got)
	}
	if rep := <-half.reports; rep.Lookup != "api" {
		t.Errorf("report %+v, want lookup api", rep)
	}
}
