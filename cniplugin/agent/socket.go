package agent

// The socket the CNI plugin asks (the protocol is in cniplugin/agent.go).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/iptables"
)

const (
	// maxConcurrentCalls bounds the calls the agent runs at once; more wait for a slot, within
	// the plugin's own timeout.
	maxConcurrentCalls = 64
	// reportWait is how long the agent waits for a call's report after its reply: the longest a
	// plugin doing the call itself may take (its API timeout and its write).
	reportWait = 2 * time.Minute
)

type server struct {
	a    *Agent
	ln   *net.UnixListener
	path string
	wg   sync.WaitGroup
	slot chan struct{}
}

// listen makes the socket's directory root-only, replaces a stale socket (and nothing else), and
// listens.
func (a *Agent) listen() (*server, error) {
	path := a.opts.Socket
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("socket directory %s: %w", dir, err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, fmt.Errorf("socket directory %s: make it root-only: %w", dir, err)
	}
	switch fi, err := os.Lstat(path); {
	case err == nil && fi.Mode().Type() == fs.ModeSocket:
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("remove the stale socket %s: %w", path, err)
		}
	case err == nil:
		return nil, fmt.Errorf("refusing to replace %s: it is not a socket (mode %s); remove it", path, fi.Mode())
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket %s: make it root-only: %w", path, err)
	}
	a.log.Info("serving the CNI plugin", "socket", path)
	return &server{a: a, ln: ln, path: path, slot: make(chan struct{}, maxConcurrentCalls)}, nil
}

func (s *server) close() {
	s.ln.Close()
	s.wg.Wait()
}

func (s *server) serve(ctx context.Context) {
	go func() {
		<-ctx.Done()
		s.ln.Close()
	}()
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				s.a.log.Error("socket accept failed; lookups go to the API until the agent restarts", "socket", s.path, "error", err)
			}
			return
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer conn.Close()
			// On shutdown, stop waiting for a request or a report at once.
			defer context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })()
			select {
			case s.slot <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-s.slot }()
			s.a.conn(ctx, conn)
		}()
	}
}

// conn runs one exchange: a request, its reply, then the plugin's report.
func (a *Agent) conn(ctx context.Context, conn *net.UnixConn) {
	peer := peerOf(conn)
	if peer.uid != 0 {
		a.metrics.requests.WithLabelValues("refused").Inc()
		a.log.Warn("refused a connection from a process not running as root", "pid", peer.pid, "uid", peer.uid)
		return
	}
	_ = conn.SetDeadline(time.Now().Add(reportWait))
	buf := make([]byte, cniplugin.MaxAgentMessage)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		a.log.Warn("read a request", "pid", peer.pid, "error", err)
		return
	}
	// The descriptors are closed before the reply: once the plugin has it, the runtime may
	// remove the namespace.
	fds := receivedFDs(oob[:oobn])
	closeFDs := func() {
		for _, f := range fds {
			f.Close()
		}
		fds = nil
	}
	defer closeFDs()
	var req cniplugin.AgentRequest
	switch {
	case flags&syscall.MSG_TRUNC != 0:
		err = fmt.Errorf("larger than %d bytes", cniplugin.MaxAgentMessage)
	default:
		err = json.Unmarshal(buf[:n], &req)
	}
	if err == nil {
		err = checkRequest(&req, len(fds))
	}
	if err != nil {
		a.metrics.requests.WithLabelValues("malformed").Inc()
		a.log.Warn("malformed request; told the plugin to do the call itself", "pid", peer.pid, "error", err.Error(),
			"request", truncate(string(buf[:n]), 200))
		closeFDs()
		a.reply(conn, &cniplugin.AgentReply{Reason: "malformed request: " + err.Error()})
		return
	}
	var netns *os.File
	if len(fds) == 1 {
		netns = fds[0]
	}
	reply := a.handle(ctx, &req, netns)
	closeFDs()
	a.reply(conn, reply)

	n, err = conn.Read(buf)
	if err != nil {
		a.log.Debug("no report from the plugin", "containerID", req.ContainerID, "error", err)
		return
	}
	var rep cniplugin.AgentReport
	if err := json.Unmarshal(buf[:n], &rep); err != nil || rep.V != cniplugin.AgentProtocol {
		a.log.Warn("malformed report", "pid", peer.pid, "containerID", req.ContainerID, "report", truncate(string(buf[:n]), 200))
		return
	}
	a.metrics.plugin(rep)
	if rep.Log != "" && a.opts.PluginLog != nil {
		_, _ = a.opts.PluginLog.Write([]byte(rep.Log))
	}
	if rep.Command == "DEL" {
		a.sandboxGone(req.ContainerID)
	}
}

// reply sends r; one too large for a message goes without its log lines, and failing that as a
// plain refusal, so that the plugin (re)does the call itself at once.
func (a *Agent) reply(conn *net.UnixConn, r *cniplugin.AgentReply) {
	r.V = cniplugin.AgentProtocol
	b, err := json.Marshal(r)
	if err == nil && len(b) > cniplugin.MaxAgentMessage && r.Log != "" {
		r.Log = "(the agent's log lines for this call did not fit in its reply; they are in the agent's log)\n"
		b, err = json.Marshal(r)
	}
	if err != nil || len(b) > cniplugin.MaxAgentMessage {
		a.log.Error("reply too large or unencodable; told the plugin to do the call itself", "bytes", len(b), "error", err)
		b, _ = json.Marshal(&cniplugin.AgentReply{V: cniplugin.AgentProtocol, Reason: "the agent's reply was too large for the socket"})
	}
	if _, err := conn.Write(b); err != nil {
		a.log.Warn("send a reply", "error", err)
	}
}

func checkRequest(req *cniplugin.AgentRequest, fds int) error {
	switch {
	case req.V != cniplugin.AgentProtocol:
		return fmt.Errorf("protocol version %d, want %d", req.V, cniplugin.AgentProtocol)
	case req.Command != "ADD" && req.Command != "CHECK" && req.Command != "DEL":
		return fmt.Errorf("command %q, want ADD, CHECK or DEL", req.Command)
	case req.NetnsFD && fds != 1, !req.NetnsFD && fds != 0:
		return fmt.Errorf("%d file descriptors attached, netnsFD is %t", fds, req.NetnsFD)
	case len(req.Config) == 0:
		return errors.New("no config")
	}
	return nil
}

// handle runs a request the way the plugin would, or says why the plugin must do it itself.
func (a *Agent) handle(ctx context.Context, req *cniplugin.AgentRequest, netns *os.File) *cniplugin.AgentReply {
	outcome := "handled"
	defer func() { a.metrics.requests.WithLabelValues(outcome).Inc() }()
	if !a.synced.Load() {
		outcome = "fallback"
		return &cniplugin.AgentReply{Reason: "the agent's watches have not synced yet"}
	}
	pod, _ := cniplugin.ParseCNIArgs(req.Args)
	api := &cacheAPI{a: a, uid: k8stypes.UID(pod.UID)}
	conf, _ := cniplugin.ParseConfigLenient(req.Config)
	if conf != nil && needsBinaries(conf.Linkerd.IPTablesMode) {
		// Its image has no iptables binaries: the plugin writes with the node's.
		return a.lookupOnly(ctx, api, req, pod, &outcome, fmt.Sprintf("iptables-mode %q is written by the node's iptables binaries", conf.Linkerd.IPTablesMode))
	}

	fdPath := ""
	if netns != nil {
		fdPath = "/proc/self/fd/" + strconv.Itoa(int(netns.Fd()))
	} else if req.Netns != "" && req.Command != "DEL" {
		outcome = "malformed"
		return &cniplugin.AgentReply{Reason: "no network namespace attached"}
	}
	var out, logs bytes.Buffer
	p := &cniplugin.Plugin{Stdout: &out, Stderr: &logs, Runner: a.opts.Runner, NoLogFile: true,
		NewPodAPI: func(*cniplugin.NetConf) (cniplugin.PodAPI, error) { return api, nil }}
	args := &skel.CmdArgs{ContainerID: req.ContainerID, Netns: fdPath, IfName: req.IfName, Args: req.Args,
		Path: req.Path, StdinData: req.Config}
	if netns == nil && req.Command == "DEL" {
		args.Netns = "" // gone: nothing to remove
	}
	var err error
	switch req.Command {
	case "ADD":
		err = p.Add(args)
	case "CHECK":
		err = p.Check(args)
	case "DEL":
		err = p.Del(args)
		a.sandboxGone(req.ContainerID)
	}
	if errors.Is(api.notSeen, errNotSeen) {
		// The plugin asks the API; its report carries its own lines.
		outcome = "fallback"
		return &cniplugin.AgentReply{Reason: api.notSeen.Error()}
	}
	// Messages name the namespace as the runtime did, not as this process reached it.
	text := logs.String()
	if fdPath != "" {
		text = strings.ReplaceAll(text, fdPath, req.Netns)
	}
	if a.opts.PluginLog != nil && text != "" {
		_, _ = a.opts.PluginLog.Write([]byte(text))
	}
	var ce *types.Error
	if err != nil && !errors.As(err, &ce) {
		ce = types.NewError(types.ErrInternal, err.Error(), "")
	}
	if ce != nil && fdPath != "" {
		ce.Msg = strings.ReplaceAll(ce.Msg, fdPath, req.Netns)
	}
	if ce != nil && ce.Code == types.ErrInternal && req.Command == "ADD" {
		// Writing or reading the rules failed here (a kernel that needs the binaries this image
		// lacks, a read-only /proc/sys...): the plugin tries with the node's own tools.
		return a.lookupOnly(ctx, api, req, pod, &outcome, "the agent could not do it: "+ce.Msg)
	}
	return &cniplugin.AgentReply{Handled: true, Result: out.Bytes(), Error: ce, Log: cniplugin.TruncateAgentLog(text)}
}

// lookupOnly answers with what the agent knows of the pod, so that the plugin does the rest
// without an API request; without a pod (DEL, not seen) the plugin does it all.
func (a *Agent) lookupOnly(ctx context.Context, api *cacheAPI, req *cniplugin.AgentRequest, pod cniplugin.PodArgs, outcome *string, why string) *cniplugin.AgentReply {
	r := &cniplugin.AgentReply{Reason: why}
	*outcome = "fallback"
	if req.Command != "DEL" && pod.Namespace != "" && pod.Name != "" {
		if r.Lookup = api.lookup(ctx, pod.Namespace, pod.Name); r.Lookup != nil {
			*outcome = "lookup"
		} else if api.notSeen != nil {
			r.Reason += "; " + api.notSeen.Error()
		}
	}
	return r
}

// needsBinaries tells the modes whose rules only the iptables binaries write.
func needsBinaries(m iptables.Mode) bool { return m == iptables.ModeLegacy || m == iptables.ModePlain }

type peer struct{ pid, uid int }

func peerOf(conn *net.UnixConn) peer {
	p := peer{pid: -1, uid: -1}
	raw, err := conn.SyscallConn()
	if err != nil {
		return p
	}
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			p = peer{pid: int(cred.Pid), uid: int(cred.Uid)}
		}
	})
	return p
}

// receivedFDs returns the descriptors passed with a message, as files the caller closes.
func receivedFDs(oob []byte) []*os.File {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "netns"))
		}
	}
	return files
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
