package wire

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/iptables"
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
		req, fd, err := ReadRequest(c)
		if err != nil {
			got <- err
			return
		}
		if fd != nil {
			fd.Close()
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
		if name == "unknown" && CodeOf(err) != CodeNotSeen {
			t.Errorf("CodeOf(%v) = %q, want %q", err, CodeOf(err), CodeNotSeen)
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
		_, fd, err := ReadRequest(c)
		if fd != nil {
			fd.Close()
		}
		errs <- err
	})
	self, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	good := `{"v":2,"command":"ADD","namespace":"app","name":"web","containerID":"c1"}`
	writeReq := `{"v":3,"command":"ADD","namespace":"app","name":"web","containerID":"c1","netns":"/var/run/netns/cni-1","ifName":"eth0"}`
	for _, tc := range []struct {
		name, body string
		fds        []int
		want       string
	}{
		{"a descriptor", good, []int{int(self.Fd())}, "node agent: refused: file descriptors attached (protocol 2 carries none); closed unused"},
		{"too large", good + strings.Repeat(" ", MaxMessage), nil, "node agent: too-large: a message larger than 131072 bytes"},
		{"another version", `{"v":4,"command":"ADD"}`, nil, "node agent: version: protocol version 4, want 2 or 3"},
		{"no version", `{"command":"ADD"}`, nil, "node agent: version: protocol version 0, want 2 or 3"},
		{"a write without its descriptor", writeReq, nil, "node agent: malformed: a write request without the pod's network namespace attached"},
		{"a write with two descriptors", writeReq, []int{int(self.Fd()), int(self.Fd())}, "node agent: refused: more than one file descriptor attached; closed unused"},
		{"a write of a CHECK", strings.Replace(writeReq, "ADD", "CHECK", 1), []int{int(self.Fd())}, "node agent: malformed: a write request for CHECK: only ADD writes"},
		{"a write without CNI_NETNS", strings.Replace(writeReq, `"netns":"/var/run/netns/cni-1",`, "", 1), []int{int(self.Fd())}, "node agent: malformed: a write request without its CNI_NETNS"},
		{"a write with a network config", strings.Replace(writeReq, `"ifName"`, `"config":{},"ifName"`, 1), []int{int(self.Fd())}, `node agent: malformed: json: unknown field "config"`},
		{"a lookup with netns", strings.Replace(good, `"c1"`, `"c1","netns":"/var/run/netns/x"`, 1), nil, "node agent: malformed: a lookup (version 2) with netns or ifName"},
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

// TestWriteExchange: a write request crosses with its descriptor (the same namespace, received as
// a descriptor of the agent's), its reply's Written and the report's route come back; an agent
// that speaks only lookups answers a write with a version-2 refusal, which AskWrite returns as
// CodeVersion with no exchange (the plugin then asks with Ask).
func TestWriteExchange(t *testing.T) {
	self, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	var want syscall.Stat_t
	if err := syscall.Fstat(int(self.Fd()), &want); err != nil {
		t.Fatal(err)
	}
	got := make(chan any, 4)
	socket := listen(t, func(c *net.UnixConn) {
		req, fd, err := ReadRequest(c)
		if err != nil {
			got <- err
			return
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(int(fd.Fd()), &st); err != nil || st.Ino != want.Ino || st.Dev != want.Dev {
			got <- fmt.Errorf("the descriptor received is not the one sent (%v)", err)
		}
		fd.Close()
		got <- req
		_ = Answer(c, Reply{V: WriteVersion, Written: &Written{Kind: "meshed", Backend: "iptables-nft", Changed: true, Error: &CNIError{Code: 7, Msg: "bad"}}})
		rep, err := ReadReport(c)
		if err != nil {
			got <- err
			return
		}
		got <- rep
	})
	req := Request{Namespace: "app", Name: "web", UID: "u1", ContainerID: "c1", Netns: "/var/run/netns/cni-1", IfName: "eth0"}
	ex, err := AskWrite(socket, 2*time.Second, req, self)
	if err != nil {
		t.Fatal(err)
	}
	if w := ex.Reply.Written; w == nil || w.Kind != "meshed" || !w.Changed || w.Error == nil || w.Error.Code != 7 {
		t.Errorf("written %+v", w)
	}
	ex.Report(Report{Command: CommandAdd, Result: "error", Code: 7, Lookup: "agent", Route: RouteAgent})
	req.V, req.Command = WriteVersion, CommandAdd
	if r := <-got; r != req {
		t.Errorf("request %v, want %+v", r, req)
	}
	if rep, ok := (<-got).(Report); !ok || rep.V != WriteVersion || rep.Route != RouteAgent {
		t.Errorf("report %+v, want version 3 with route agent", rep)
	}

	// An agent of lookups only: it refuses the descriptor in version 2.
	old := listen(t, func(c *net.UnixConn) {
		_, _, err := readMessage(c, make([]byte, MaxMessage), false)
		var werr *Error
		if errors.As(err, &werr) {
			_ = Answer(c, Reply{Error: werr})
		}
	})
	ex, err = AskWrite(old, 2*time.Second, req, self)
	if ex != nil || CodeOf(err) != CodeVersion || !strings.Contains(err.Error(), "file descriptors attached") {
		t.Errorf("an agent of lookups only: %v (exchange %v), want a version error", err, ex)
	}
}

// TestCapabilityErrorCrosses: a capability error stays one across the socket. The agent's
// decline for want of a capability (its own, or the kernel's refusal of its write) reaches the
// plugin as an *Error in which errors.As finds the *iptables.CapabilityError the agent had, with
// its capabilities, namespace, operation, text and error number; a decline for another reason
// holds none.
func TestCapabilityErrorCrosses(t *testing.T) {
	self, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	refused := &iptables.CapabilityError{Caps: []string{"CAP_NET_ADMIN"}, NetNS: "net:[4026532281]", Op: "write the iptables-nft nat rules",
		Err: fmt.Errorf("netlink: %w", syscall.EPERM)}
	declines := map[string]*Error{
		"capability":   CapabilityErrorf(refused, "pod app/web: %v", refused),
		"cannot-write": Errorf(CodeCannotWrite, "iptables-mode legacy is written with the iptables binaries"),
	}
	socket := listen(t, func(c *net.UnixConn) {
		req, fd, err := ReadRequest(c)
		if err != nil {
			return
		}
		fd.Close()
		_ = Answer(c, Reply{V: WriteVersion, Pod: []byte(`{}`), Namespace: []byte(`{}`), Declined: declines[req.Name]})
	})
	for name, sent := range declines {
		ex, err := AskWrite(socket, 2*time.Second, Request{Namespace: "app", Name: name, ContainerID: "c1", Netns: "/var/run/netns/cni-1", IfName: "eth0"}, self)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		ex.Report(Report{Command: CommandAdd, Result: "ok", Lookup: "agent", Route: RoutePlugin})
		got := ex.Reply.Declined
		if got == nil || got.Error() != sent.Error() {
			t.Fatalf("%s: declined %v, want %v", name, got, sent)
		}
		var ce *iptables.CapabilityError
		if name != "capability" {
			if errors.As(got, &ce) || iptables.IsCapabilityError(got) {
				t.Errorf("%s: a capability error in %v", name, got)
			}
			continue
		}
		if !errors.As(got, &ce) || !iptables.IsCapabilityError(fmt.Errorf("wrapped: %w", got)) {
			t.Fatalf("%s: no *iptables.CapabilityError in %#v", name, got)
		}
		if ce.Error() != refused.Error() || !slices.Equal(ce.Caps, refused.Caps) || ce.NetNS != refused.NetNS || ce.Op != refused.Op {
			t.Errorf("%s: %+v, want %+v", name, ce, refused)
		}
		if !errors.Is(got, syscall.EPERM) || !errors.Is(got, fs.ErrPermission) {
			t.Errorf("%s: errors.Is(%v, EPERM) is false", name, got)
		}
	}
}
