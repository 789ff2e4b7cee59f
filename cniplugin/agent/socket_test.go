package agent_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
	"github.com/kubemesh/proxy-init/test/kubetest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// envAsk makes this test binary a plugin-like client of the agent's socket (see TestMain): it asks
// for a pod and prints the error it gets.
const envAsk = "AGENT_TEST_ASK"

func TestMain(m *testing.M) {
	if socket := os.Getenv(envAsk); socket != "" {
		ns, name, _ := strings.Cut(os.Getenv(envAsk+"_POD"), "/")
		req := wire.Request{Command: wire.CommandAdd, Namespace: ns, Name: name, ContainerID: "helper"}
		var ex *wire.Exchange
		var err error
		if netns := os.Getenv(envAsk + "_NETNS"); netns != "" {
			// A write request (route 1), with the namespace attached.
			f, oerr := os.Open(netns)
			if oerr != nil {
				fmt.Println(oerr)
				os.Exit(0)
			}
			req.Netns, req.IfName = netns, "eth0"
			ex, err = wire.AskWrite(socket, 10*time.Second, req, f)
		} else {
			ex, err = wire.Ask(socket, 10*time.Second, req)
		}
		ex.Report(wire.Report{Command: wire.CommandAdd, Result: "ok", Lookup: "api"})
		fmt.Println(err)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// sendRaw sends body, with fds attached, on a new connection to the agent's socket and returns
// its reply.
func sendRaw(t *testing.T, socket string, body []byte, fds ...int) wire.Reply {
	t.Helper()
	conn, err := net.Dial("unixpacket", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	uc := conn.(*net.UnixConn)
	var oob []byte
	if len(fds) > 0 {
		oob = syscall.UnixRights(fds...)
	}
	if _, _, err := uc.WriteMsgUnix(body, oob, nil); err != nil {
		t.Fatal(err)
	}
	_ = uc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, wire.MaxMessage)
	n, err := uc.Read(buf)
	if err != nil {
		t.Fatalf("no reply: %v", err)
	}
	var reply wire.Reply
	if err := json.Unmarshal(buf[:n], &reply); err != nil {
		t.Fatalf("reply %q: %v", buf[:n], err)
	}
	return reply
}

// testRefusedMessages: every message the protocol does not carry is refused with a typed error,
// logged at warning with the peer's PID and UID, and counted; nothing is written anywhere, and the
// agent keeps serving. Among them, the requests of protocol 1, which carried the network config
// and the pod's namespace as a descriptor: a caller could send its own config (other ports) with
// any namespace, the node's included (a namespace of the test's stands for it here).
func testRefusedMessages(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{})
	p := r.createPod("web", nil, nil)
	forged := strings.NewReplacer(`"incoming-proxy-port":4143`, `"incoming-proxy-port":1`, `"outgoing-proxy-port":4140`, `"outgoing-proxy-port":2`).Replace(string(r.conf))
	podArgs := fmt.Sprintf("K8S_POD_NAMESPACE=%s;K8S_POD_NAME=web", r.ns)
	v1 := fmt.Sprintf(`{"v":1,"command":"ADD","containerID":"forged","netns":"/proc/1/ns/net","netnsFD":true,"ifName":"eth0","args":%q,"path":"/opt/cni/bin","config":%s}`, podArgs, forged)
	good := fmt.Sprintf(`{"v":2,"command":"ADD","namespace":%q,"name":"web","containerID":"c1"}`, r.ns)
	node := nt.NewNS(t) // stands for the node's network namespace
	nodeFD, err := os.Open(node.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer nodeFD.Close()
	for _, tc := range []struct {
		name string
		body string
		fds  []int
		code wire.Code
		want string
	}{
		{"protocol 1: a forged config and the node's namespace", v1, []int{int(nodeFD.Fd())}, wire.CodeRefused,
			"file descriptors attached (protocol 2 carries none); closed unused"},
		{"protocol 1 without the descriptor", v1, nil, wire.CodeVersion, "protocol version 1, want 2"},
		{"a network config in a request", strings.TrimSuffix(good, "}") + `,"config":` + forged + "}", nil, wire.CodeMalformed, `json: unknown field "config"`},
		{"a good request with the node's namespace", good, []int{int(nodeFD.Fd())}, wire.CodeRefused, "file descriptors attached"},
		{"not JSON", "GET / HTTP/1.1\r\n", nil, wire.CodeMalformed, "invalid character 'G' looking for beginning of value"},
		{"an unknown command", strings.Replace(good, `"ADD"`, `"VERSION"`, 1), nil, wire.CodeMalformed, `command "VERSION", want ADD, CHECK or DEL`},
		{"no pod", `{"v":2,"command":"CHECK","containerID":"c1"}`, nil, wire.CodeMalformed, "no pod namespace and name"},
		{"oversized", strings.TrimSuffix(good, "}") + `,"pad":"` + strings.Repeat("x", wire.MaxMessage) + `"}`, nil, wire.CodeTooLarge,
			fmt.Sprintf("a message larger than %d bytes", wire.MaxMessage)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := r.metric(`socket_requests_total{outcome="` + string(tc.code) + `"}`)
			reply := sendRaw(t, r.socket, []byte(tc.body), tc.fds...)
			if reply.Error == nil || reply.Error.Code != tc.code || !strings.HasPrefix(reply.Error.Message, tc.want) || reply.Pod != nil {
				t.Errorf("reply %+v (error %+v), want %s: %s", reply, reply.Error, tc.code, tc.want)
			}
			want := fmt.Sprintf(`level=WARN msg="refused a request on the plugin socket; the plugin reads the pod itself" node=%s pid=%d uid=0 code=%s error=`, r.node, os.Getpid(), tc.code)
			if !strings.Contains(r.log.String(), want) {
				t.Errorf("the agent's log lacks %s:\n%s", want, r.log.String())
			}
			n, _ := strconv.Atoi(before)
			if got := r.metric(`socket_requests_total{outcome="` + string(tc.code) + `"}`); got != strconv.Itoa(n+1) {
				t.Errorf("%s = %q, want %d", tc.code, got, n+1)
			}
		})
	}
	for _, ns := range []*nt.NS{node, p.netns} {
		expectNoneWritten(t, ns)
	}
	// Still serving: the plugin's ADD writes the node config's rules, not the forged ones.
	if add := r.run("ADD", r.args(p, r.conf)); add.err != nil || len(add.api.Calls()) != 0 {
		t.Errorf("ADD after the bad requests: %v, API lookups %v", add.err, add.api.Calls())
	}
	expectRules(t, p, expected(t, "nft", nil))
}

// expectNoneWritten asserts that ns holds no netfilter state at all.
func expectNoneWritten(t *testing.T, ns *nt.NS) {
	t.Helper()
	if out, err := nt.RunIn(t, ns, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(out) != "" {
		t.Errorf("%s holds rules (%v):\n%s", ns.Name(), err, out)
	}
	if out, err := nt.RunIn(t, ns, "iptables-legacy-save", "-t", "nat"); err != nil || strings.Contains(out, "PROXY_INIT") {
		t.Errorf("%s holds legacy rules (%v):\n%s", ns.Name(), err, out)
	}
}

// testUnprivilegedPeers: a client that is root but lacks CAP_SYS_ADMIN (its capabilities dropped
// with setpriv), or holds it only in a user namespace of its own (unshare), is refused, logged at
// warning with its PID, counted; the agent keeps serving.
func testUnprivilegedPeers(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{})
	p := r.createPod("web", nil, nil)
	for _, tc := range []struct {
		name string
		wrap []string
		want string
	}{
		{"capabilities dropped", []string{"setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--"},
			"node agent: refused: the peer does not hold CAP_SYS_ADMIN (CapEff 0000000000000000), as the plugin the container runtime runs does"},
		{"a user namespace of its own", []string{"unshare", "--user", "--map-root-user", "--"},
			`node agent: refused: the peer runs in a user namespace of its own (uid_map "0 0 1"), where its capabilities are not the node's`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := exec.LookPath(tc.wrap[0]); err != nil {
				t.Skipf("%s (util-linux) is not installed", tc.wrap[0])
			}
			cmd := exec.Command(tc.wrap[0], append(tc.wrap[1:], os.Args[0], "-test.run=^$")...)
			cmd.Env = append(os.Environ(), envAsk+"="+r.socket, envAsk+"_POD="+r.ns+"/web")
			var out, errOut bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &errOut
			if err := cmd.Run(); err != nil {
				t.Fatalf("%v: %v\n%s", cmd.Args, err, errOut.String())
			}
			if got := strings.TrimSpace(out.String()); got != tc.want {
				t.Errorf("the client got %q\nwant %q", got, tc.want)
			}
			want := fmt.Sprintf(`level=WARN msg="refused a request on the plugin socket; the plugin reads the pod itself" node=%s pid=%d uid=0 code=refused`, r.node, cmd.Process.Pid)
			if !strings.Contains(r.log.String(), want) {
				t.Errorf("the agent's log lacks %s:\n%s", want, r.log.String())
			}
		})
	}
	if got := r.metric(`socket_requests_total{outcome="refused"}`); got != "2" {
		t.Errorf("refused = %q, want 2", got)
	}
	if add := r.run("ADD", r.args(p, r.conf)); add.err != nil || len(add.api.Calls()) != 0 {
		t.Errorf("ADD after the refusals: %v, API lookups %v", add.err, add.api.Calls())
	}
}
