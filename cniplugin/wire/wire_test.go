package wire

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// listen serves one exchange per connection with serve, on a socket in a root-only directory.
func listen(t *testing.T, serve func(*net.UnixConn)) string {
	t.Helper()
	nt.RequireRoot(t, "the client talks only to a socket root owns")
	dir, err := os.MkdirTemp("", "wire-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "agent.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				serve(c)
			}()
		}
	}()
	return path
}

// TestExchange: a request, its reply and the report cross as sent; the peer (this process: root,
// CAP_SYS_ADMIN, the initial user namespace) passes the checks, named by its PID; a reply too
// large for a message arrives as CodeTooLarge; a typed refusal is returned with the exchange, so
// the report still goes.
func TestExchange(t *testing.T) {
	got := make(chan any, 4)
	pod := `{"metadata":{"name":"web"}}`
	socket := listen(t, func(c *net.UnixConn) {
		peer, err := CheckPeer(c, "/proc")
		got <- fmt.Sprint(peer, err)
		req, err := ReadRequest(c)
		if err != nil {
			got <- err
			return
		}
		got <- req
		switch req.Name {
		case "big":
			_ = Answer(c, Reply{Pod: []byte(`"` + strings.Repeat("x", MaxMessage) + `"`)})
		case "unknown":
			_ = Answer(c, Reply{Error: Errorf(CodeNotSeen, "pod %s/%s is not among the pods of node n1", req.Namespace, req.Name)})
		default:
			_ = Answer(c, Reply{Pod: []byte(pod), Namespace: []byte(pod)})
		}
		rep, err := ReadReport(c)
		if err != nil {
			got <- err
			return
		}
		got <- rep
	})
	req := Request{Command: CommandAdd, Namespace: "app", Name: "web", UID: "u1", ContainerID: "c1"}
	ex, err := Ask(socket, 2*time.Second, req)
	if err != nil {
		t.Fatal(err)
	}
	if string(ex.Reply.Pod) != pod || string(ex.Reply.Namespace) != pod || ex.Reply.Error != nil {
		t.Errorf("reply %+v", ex.Reply)
	}
	report := Report{Command: CommandAdd, Result: "error", Code: 7, Lookup: "agent", Seconds: 0.01, Log: strings.Repeat("line\n", MaxLog)}
	ex.Report(report)
	if p := <-got; p != fmt.Sprint(Peer{PID: os.Getpid(), UID: 0}, nil) {
		t.Errorf("peer %v, want this process", p)
	}
	req.V = Version
	if r := <-got; r != req {
		t.Errorf("request %+v, want %+v", r, req)
	}
	rep, ok := (<-got).(Report)
	report.V = Version
	if !ok || rep.Command != report.Command || rep.Code != 7 || rep.Lookup != "agent" || len(rep.Log) > MaxLog+len("(log truncated)\n") ||
		!strings.HasSuffix(rep.Log, "line\n(log truncated)\n") {
		t.Errorf("report %+v", rep)
	}

	for name, want := range map[string]string{
		"big":     fmt.Sprintf("node agent: too-large: the answer is %d bytes, more than the %d of a message", MaxMessage+len(`{"v":2,"pod":""}`), MaxMessage),
		"unknown": "node agent: not-seen: pod app/unknown is not among the pods of node n1",
	} {
		ex, err := Ask(socket, 2*time.Second, Request{Command: CommandCheck, Namespace: "app", Name: name})
		if err == nil || err.Error() != want || ex == nil {
			t.Errorf("%s: %v (exchange %v), want %s with the exchange", name, err, ex, want)
		}
		if name == "unknown" && !IsNotSeen(err) {
			t.Errorf("IsNotSeen(%v) = false", err)
		}
		ex.Report(Report{Command: CommandCheck, Result: "ok", Lookup: "api"})
		<-got
		<-got
		<-got
	}
}

// TestReadRequestRefuses: each message the protocol does not carry is refused with its code and
// reason.
func TestReadRequestRefuses(t *testing.T) {
	errs := make(chan error, 1)
	socket := listen(t, func(c *net.UnixConn) {
		_, err := ReadRequest(c)
		errs <- err
	})
	self, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	good := `{"v":2,"command":"ADD","namespace":"app","name":"web","containerID":"c1"}`
	for _, tc := range []struct {
		name, body string
		fds        []int
		want       string
	}{
		{"a descriptor", good, []int{int(self.Fd())}, "node agent: refused: file descriptors attached (protocol 2 carries none); closed unused"},
		{"too large", good + strings.Repeat(" ", MaxMessage), nil, "node agent: too-large: a message larger than 131072 bytes"},
		{"another version", `{"v":3,"command":"ADD"}`, nil, "node agent: version: protocol version 3, want 2"},
		{"no version", `{"command":"ADD"}`, nil, "node agent: version: protocol version 0, want 2"},
		{"not JSON", "\x00\x01", nil, "node agent: malformed: invalid character '\\x00' looking for beginning of value"},
		{"an unknown field", strings.Replace(good, `"c1"`, `"c1","netnsFD":true`, 1), nil, `node agent: malformed: json: unknown field "netnsFD"`},
		{"an unknown command", strings.Replace(good, "ADD", "GC", 1), nil, `node agent: malformed: command "GC", want ADD, CHECK or DEL`},
		{"no pod", `{"v":2,"command":"ADD","containerID":"c1"}`, nil, "node agent: malformed: no pod namespace and name in a ADD request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("unixpacket", socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			var oob []byte
			if tc.fds != nil {
				oob = syscall.UnixRights(tc.fds...)
			}
			if _, _, err := c.(*net.UnixConn).WriteMsgUnix([]byte(tc.body), oob, nil); err != nil {
				t.Fatal(err)
			}
			if err := <-errs; err == nil || err.Error() != tc.want {
				t.Errorf("ReadRequest = %v\nwant %s", err, tc.want)
			}
		})
	}
	// A DEL names no pod: the agent only learns the sandbox is going.
	c, err := net.Dial("unixpacket", socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(`{"v":2,"command":"DEL","containerID":"c1"}`)); err != nil {
		t.Fatal(err)
	}
	if err := <-errs; err != nil {
		t.Errorf("a DEL: %v", err)
	}
}

// TestCheckProcess: the checks themselves, on this process and on /proc files written to show
// what a peer without CAP_SYS_ADMIN, or in a user namespace of its own, looks like (the agent's
// tests run such peers for real).
func TestCheckProcess(t *testing.T) {
	nt.RequireRoot(t, "this process must hold CAP_SYS_ADMIN")
	if err := checkProcess("/proc", os.Getpid()); err != nil {
		t.Errorf("this process: %v", err)
	}
	initMap, err := os.ReadFile("/proc/1/uid_map")
	if err != nil {
		t.Fatal(err)
	}
	proc := t.TempDir()
	write := func(pid, capEff, uidMap string) {
		dir := filepath.Join(proc, pid)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "status"), []byte("Name:\tx\nCapEff:\t"+capEff+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "uid_map"), []byte(uidMap), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("1", "000001ffffffffff", string(initMap))
	write("10", "000001ffffffffff", string(initMap))
	write("11", "00000000a80425fb", string(initMap)) // a container runtime's default set: no CAP_SYS_ADMIN
	write("12", "000001ffffffffff", "         0          0          1\n")
	for pid, want := range map[int]string{
		10: "",
		11: "node agent: refused: the peer does not hold CAP_SYS_ADMIN (CapEff 00000000a80425fb), as the plugin the container runtime runs does",
		12: `node agent: refused: the peer runs in a user namespace of its own (uid_map "0 0 1"), where its capabilities are not the node's`,
		13: "node agent: refused: cannot read the peer's capabilities: open " + proc + "/13/status: no such file or directory",
	} {
		err := checkProcess(proc, pid)
		if (want == "" && err != nil) || (want != "" && (err == nil || err.Error() != want)) {
			t.Errorf("pid %d: %v\nwant %q", pid, err, want)
		}
		var werr *Error
		if want != "" && !errors.As(err, &werr) {
			t.Errorf("pid %d: %T is not a *wire.Error", pid, err)
		}
	}
}
