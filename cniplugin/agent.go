package cniplugin

// The plugin's side of the node agent (package cniplugin/agent, `linkerd-cni agent` in the
// DaemonSet). Each ADD, CHECK and DEL is first offered to the agent over its UNIX socket, in one
// exchange on one connection:
//
//  1. the plugin sends an AgentRequest (its whole invocation: CNI_* and the config) with the
//     pod's network namespace attached as a file descriptor (SCM_RIGHTS), so the agent acts on
//     exactly the namespace the runtime named, whatever its path looks like in the agent's
//     container;
//  2. the agent answers with an AgentReply: either it ran the command itself (the pod from its
//     watch cache, the rules through the same backend.Runner and namespace lock), or it says why
//     not, with what it knows of the pod when it knows it;
//  3. the plugin sends an AgentReport (how the call ended, its duration and its own log lines)
//     and closes; the agent turns it into metrics and log lines.
//
// The plugin trusts the agent's answer, so it talks only to a socket that root owns in a
// directory only root can write. When the agent is absent, not ready, slow, does not know the
// pod, or could not write the rules itself, the plugin does the call as it always did: the API
// lookup (through the companion binary in the node's plugin, companion.go; or the agent's
// answer) and the write are its own, and ADD still fails closed. Only the standard library and
// the CNI types are used here, so the node's plugin-only build stays lean.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

const (
	// DefaultAgentSocket is where the plugin looks for the node agent when the config has no
	// agent.socket; the DaemonSet's agent listens there.
	DefaultAgentSocket = "/var/run/linkerd-cni/agent.sock"
	// DefaultAgentTimeout bounds one exchange with the agent when the config has no
	// agent.timeout: connecting, the agent's own bounded wait for a pod it has not seen yet, and
	// its write. Past it the plugin does the call itself.
	DefaultAgentTimeout = 3 * time.Second
	// AgentProtocol is the version of the messages; either side refuses another one, and the
	// plugin then does the call itself.
	AgentProtocol = 1
	// MaxAgentMessage bounds one message on the socket (a SOCK_SEQPACKET datagram).
	MaxAgentMessage = 128 << 10
	// maxAgentLog bounds the log text one message carries.
	maxAgentLog = 32 << 10
)

// AgentRequest is one plugin invocation, as the agent receives it.
type AgentRequest struct {
	V           int    `json:"v"`
	Command     string `json:"command"` // ADD, CHECK or DEL
	ContainerID string `json:"containerID"`
	// Netns is CNI_NETNS as the runtime gave it, for messages; the namespace itself is the
	// descriptor attached to the message when NetnsFD is set.
	Netns   string          `json:"netns"`
	NetnsFD bool            `json:"netnsFD"`
	IfName  string          `json:"ifName"`
	Args    string          `json:"args"`
	Path    string          `json:"path"`
	Config  json.RawMessage `json:"config"`
}

// AgentReply is the agent's answer to a request.
type AgentReply struct {
	V int `json:"v"`
	// Handled says the agent ran the command: Result is what the plugin prints (ADD's result),
	// Error its CNI error, Log its log lines.
	Handled bool            `json:"handled"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   *types.Error    `json:"error,omitempty"`
	Log     string          `json:"log,omitempty"`
	// Otherwise Reason says why not, and Lookup, when set, is what the agent knows of the pod:
	// the plugin uses it instead of the API.
	Reason string       `json:"reason,omitempty"`
	Lookup *AgentLookup `json:"lookup,omitempty"`
}

// AgentLookup is the core/v1 JSON of the objects a call reads, from the agent's watch cache;
// Service is absent when the agent has not seen default/kubernetes.
type AgentLookup struct {
	Pod       json.RawMessage `json:"pod"`
	Namespace json.RawMessage `json:"namespace"`
	Service   json.RawMessage `json:"service,omitempty"`
}

// AgentReport closes an exchange: the call as the plugin saw it end.
type AgentReport struct {
	V       int    `json:"v"`
	Command string `json:"command"`
	// Result is "ok" or "error".
	Result string `json:"result"`
	// Lookup is where the pod came from: "agent", "api", or "none" (DEL, pass-through).
	Lookup string `json:"lookup"`
	// Seconds is the call's duration from the plugin's main.
	Seconds float64 `json:"seconds"`
	// Log holds the lines the plugin logged itself (those of a call the agent handled are in
	// its own log already).
	Log string `json:"log,omitempty"`
}

// started is when the plugin's main began, for the duration it reports.
var started = time.Now()

// agentConf is the part of the config the plugin reads before offering the call to the agent.
// The agent parses the whole config itself; a config that does not even decode here is left to
// the local path, which reports it.
type agentConf struct {
	LogLevel string `json:"log_level"`
	LogFile  string `json:"log_file"`
	Agent    struct {
		Socket  *string `json:"socket"`
		Timeout string  `json:"timeout"`
	} `json:"agent"`
}

// viaAgent offers a command to the node agent and falls back to local, the plugin's own
// implementation, as the file's comment describes.
func (p *Plugin) viaAgent(cmd string, local func(*Plugin, *skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) error {
		var ac agentConf
		if !p.AskAgent || json.Unmarshal(args.StdinData, &ac) != nil {
			return local(p, args)
		}
		socket := DefaultAgentSocket
		if ac.Agent.Socket != nil {
			socket = *ac.Agent.Socket
		}
		timeout, err := time.ParseDuration(ac.Agent.Timeout)
		if ac.Agent.Timeout == "" || err != nil || timeout <= 0 {
			timeout = DefaultAgentTimeout
		}
		if socket == "" || !filepath.IsAbs(socket) {
			return local(p, args)
		}
		pod, _ := ParseCNIArgs(args.Args)
		level, _ := parseLevel(ac.LogLevel)
		var own bytes.Buffer // the plugin's own lines, for the report
		logFile := ac.LogFile
		if p.NoLogFile {
			logFile = ""
		}
		log, done := newLogger(io.MultiWriter(p.Stderr, &own), level, logFile,
			"cmd", cmd, "pod", pod.Name, "namespace", pod.Namespace, "containerID", args.ContainerID)
		defer done()

		ex, err := offer(socket, timeout, cmd, args)
		if err != nil {
			lvl := slog.LevelWarn
			if errors.Is(err, fs.ErrNotExist) {
				lvl = slog.LevelDebug // no agent on this node
			}
			log.Log(context.Background(), lvl, "node agent not used; doing the call here", "socket", socket, "error", err)
			return local(p, args)
		}
		defer ex.conn.Close()
		report := AgentReport{V: AgentProtocol, Command: cmd, Lookup: "none"}
		defer func() {
			report.Seconds = time.Since(started).Seconds()
			report.Log = TruncateAgentLog(own.String())
			ex.send(report)
		}()

		r := ex.reply
		if r.Lookup != nil && (!present(r.Lookup.Pod) || !present(r.Lookup.Namespace)) {
			r.Lookup = nil // the agent sends both or neither; half an answer is no answer
		}
		if r.Handled {
			writeLog(p.Stderr, logFile, r.Log)
			if cmd != "DEL" {
				report.Lookup = "agent"
			}
			if len(r.Result) > 0 {
				if _, err := p.Stdout.Write(r.Result); err != nil {
					report.Result = "error"
					return types.NewError(types.ErrIOFailure, fmt.Sprintf("write the result: %v", err), "")
				}
			}
			if r.Error != nil {
				report.Result = "error"
				return r.Error
			}
			report.Result = "ok"
			return nil
		}

		lp := *p
		lp.Stderr = io.MultiWriter(p.Stderr, &own)
		if r.Lookup != nil {
			log.Info("the node agent looked the pod up; the plugin does the rest", "why", r.Reason)
			lk := &agentLookup{l: r.Lookup}
			lp.NewPodAPI = func(*NetConf) (PodAPI, error) { return lk, nil }
			if cmd != "DEL" {
				report.Lookup = "agent"
			}
		} else {
			log.Info("the node agent did not take the call; doing it here", "why", r.Reason)
			if cmd != "DEL" {
				report.Lookup = "api"
			}
		}
		err = local(&lp, args)
		report.Result = "ok"
		if err != nil {
			report.Result = "error"
		}
		return err
	}
}

// exchange is one connection to the agent, after its reply.
type exchange struct {
	conn  *net.UnixConn
	reply AgentReply
}

// send writes the report, best effort: it never waits for the agent.
func (e *exchange) send(r AgentReport) {
	b, err := json.Marshal(r)
	if err != nil || len(b) > MaxAgentMessage {
		return
	}
	_ = e.conn.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	_, _ = e.conn.Write(b)
}

// offer sends the request, with the namespace's descriptor, and reads the reply, all within
// timeout. An error means the agent cannot be used for this call.
func offer(socket string, timeout time.Duration, cmd string, args *skel.CmdArgs) (*exchange, error) {
	deadline := time.Now().Add(timeout)
	req := AgentRequest{V: AgentProtocol, Command: cmd, ContainerID: args.ContainerID, Netns: args.Netns,
		IfName: args.IfName, Args: args.Args, Path: args.Path, Config: args.StdinData}
	if err := CheckAgentSocket(socket); err != nil {
		return nil, err
	}
	var oob []byte
	if args.Netns != "" {
		f, err := os.Open(args.Netns)
		switch {
		case err == nil:
			defer f.Close()
			req.NetnsFD = true
			oob = syscall.UnixRights(int(f.Fd()))
		case cmd == "DEL" && errors.Is(err, fs.ErrNotExist):
			// Nothing to remove; the agent still hears of the DEL.
		default:
			return nil, fmt.Errorf("open the pod's network namespace to pass it to the agent: %w", err)
		}
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if len(body) > MaxAgentMessage {
		return nil, fmt.Errorf("the request is %d bytes, more than the %d the socket carries", len(body), MaxAgentMessage)
	}
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("unixpacket", socket)
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	ok := false
	defer func() {
		if !ok {
			conn.Close()
		}
	}()
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	if _, _, err := conn.WriteMsgUnix(body, oob, nil); err != nil {
		return nil, fmt.Errorf("send the request: %w", err)
	}
	buf := make([]byte, MaxAgentMessage)
	n, _, flags, _, err := conn.ReadMsgUnix(buf, nil)
	if err != nil {
		return nil, fmt.Errorf("no answer within %s: %w", timeout, err)
	}
	if flags&syscall.MSG_TRUNC != 0 {
		return nil, fmt.Errorf("the answer is larger than %d bytes", MaxAgentMessage)
	}
	ex := &exchange{conn: conn}
	if err := json.Unmarshal(buf[:n], &ex.reply); err != nil {
		return nil, fmt.Errorf("malformed answer: %w", err)
	}
	if ex.reply.V != AgentProtocol {
		return nil, fmt.Errorf("the agent speaks protocol version %d, the plugin %d", ex.reply.V, AgentProtocol)
	}
	ok = true
	return ex, nil
}

// CheckAgentSocket refuses a socket the plugin must not trust: one that is not a socket, or that
// anyone but root owns, or whose directory anyone but root owns or may write.
func CheckAgentSocket(path string) error {
	dir := filepath.Dir(path)
	for _, c := range []struct {
		path string
		typ  fs.FileMode
		what string
	}{{dir, fs.ModeDir, "a directory"}, {path, fs.ModeSocket, "a socket"}} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			return err
		}
		if fi.Mode().Type() != c.typ {
			return fmt.Errorf("%s is not %s but %s", c.path, c.what, fileKind(fi.Mode()))
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok || st.Uid != 0 {
			return fmt.Errorf("%s is not owned by root", c.path)
		}
		if c.typ == fs.ModeDir && fi.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("%s is writable by others than root (mode %o)", c.path, fi.Mode().Perm())
		}
	}
	return nil
}

func fileKind(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "a regular file"
	case fs.ModeDir:
		return "a directory"
	case fs.ModeSymlink:
		return "a symbolic link"
	case fs.ModeSocket:
		return "a socket"
	case fs.ModeNamedPipe:
		return "a named pipe"
	}
	return "a special file"
}

// writeLog writes lines the agent logged for this call where the plugin's own lines go: stderr
// (the runtime's log) and log_file, in one write each so concurrent calls' lines stay whole.
func writeLog(stderr io.Writer, logFile, text string) {
	if text == "" {
		return
	}
	_, _ = io.WriteString(stderr, text)
	if logFile == "" {
		return
	}
	f, err := OpenLogFile(logFile)
	if err != nil {
		return // the plugin's own logger has said why, or will
	}
	_, _ = io.WriteString(f, text)
	_ = f.Close()
}

// TruncateAgentLog bounds log text to what a message carries, keeping whole lines from the start.
func TruncateAgentLog(s string) string {
	if len(s) <= maxAgentLog {
		return s
	}
	cut := s[:maxAgentLog]
	if i := bytes.LastIndexByte([]byte(cut), '\n'); i >= 0 {
		cut = cut[:i+1]
	}
	return cut + "(log truncated)\n"
}

// agentLookup serves a call's lookups from the agent's answer, which holds the pod and its
// namespace. Without default/kubernetes in it (the agent's watch has not delivered that Service),
// a control-plane pod skips 443 and 6443, as when the agent writes the rules itself.
type agentLookup struct{ l *AgentLookup }

func (a *agentLookup) Cached() bool { return true }

func (a *agentLookup) Pod(_ context.Context, namespace, name string) (*Pod, error) {
	var pod Pod
	return &pod, decodeAgentObject("pod "+namespace+"/"+name, a.l.Pod, &pod)
}

func (a *agentLookup) Namespace(_ context.Context, name string) (*Namespace, error) {
	var ns Namespace
	return &ns, decodeAgentObject("namespace "+name, a.l.Namespace, &ns)
}

func (a *agentLookup) Service(_ context.Context, namespace, name string) (*Service, error) {
	if !present(a.l.Service) {
		return nil, fmt.Errorf("service %s/%s: not in the node agent's answer", namespace, name)
	}
	var svc Service
	return &svc, decodeAgentObject("service "+namespace+"/"+name, a.l.Service, &svc)
}

// present tells an object in the agent's answer from an absent or null one.
func present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

func decodeAgentObject(what string, raw json.RawMessage, into any) error {
	if err := json.Unmarshal(raw, into); err != nil {
		return fmt.Errorf("%s: decode the node agent's answer: %w", what, err)
	}
	return nil
}
