package agent

// The socket the CNI plugin asks, over the protocol of package cniplugin/wire (routes 1 and 2:
// the package doc).

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
)

const (
	// maxConcurrentCalls bounds the calls the agent serves at once; more wait for a slot, within
	// the plugin's own timeout.
	maxConcurrentCalls = 64
	// reportWait is how long the agent waits for a call's report after its reply: the longest a
	// plugin call may take (its API timeout and its write).
	reportWait = 2 * time.Minute
)

type server struct {
	a    *Agent
	ln   *net.UnixListener
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
	return &server{a: a, ln: ln, slot: make(chan struct{}, maxConcurrentCalls)}, nil
}

func (s *server) close() {
	s.ln.Close()
	s.wg.Wait()
}

func (s *server) serve(ctx context.Context) {
	context.AfterFunc(ctx, func() { s.ln.Close() })
	for {
		conn, err := s.ln.AcceptUnix()
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) {
				s.a.log.Error("socket accept failed; lookups go to the API until the agent restarts", "socket", s.a.opts.Socket, "error", err)
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

// conn runs one exchange: the peer's checks, its request, the answer, then the plugin's report.
func (a *Agent) conn(ctx context.Context, conn *net.UnixConn) {
	_ = conn.SetDeadline(time.Now().Add(reportWait))
	// The request is read even from a peer that fails the checks, so that it reads the refusal.
	peer, peerErr := wire.CheckPeer(conn, a.opts.HostProc)
	req, netns, err := wire.ReadRequest(conn)
	if netns != nil {
		defer netns.Close()
	}
	if peerErr != nil {
		err = peerErr
	}
	if err != nil {
		a.refuse(conn, peer, req, err)
		return
	}
	var reply wire.Reply
	var outcome string
	if req.V == wire.WriteVersion {
		if reply, outcome, err = a.write(ctx, req, netns); err != nil {
			a.refuse(conn, peer, req, err)
			return
		}
		// Once the plugin has the reply the runtime may remove the namespace: let it go first.
		netns.Close()
	} else {
		reply, outcome = a.answer(ctx, req)
	}
	a.metrics.requests.WithLabelValues(outcome).Inc()
	if err := wire.Answer(conn, reply); err != nil {
		a.log.Debug("could not answer the plugin", "pid", peer.PID, "container_id", req.ContainerID, "error", err.Error())
		return
	}
	rep, err := wire.ReadReport(conn)
	if err != nil {
		a.refuse(nil, peer, req, err)
		return
	}
	a.metrics.plugin(rep)
	if rep.Log != "" && a.opts.PluginLog != nil {
		_, _ = a.opts.PluginLog.Write([]byte(rep.Log))
	}
}

// refuse logs and counts a refused peer or message, and answers with the refusal when conn is
// set (in the request's version, so that a plugin that asked for a write does not take the agent
// for one of lookups only), so that the plugin reads the pod itself at once. A connection that
// ends before a message is no refusal.
func (a *Agent) refuse(conn *net.UnixConn, peer wire.Peer, req wire.Request, err error) {
	what := "request"
	if conn == nil {
		what = "report"
	}
	var werr *wire.Error
	if !errors.As(err, &werr) {
		a.log.Debug("no "+what+" from the plugin", "pid", peer.PID, "uid", peer.UID, "error", err.Error())
		return
	}
	a.metrics.requests.WithLabelValues(string(werr.Code)).Inc()
	msg := "refused a " + what + " on the plugin socket"
	if conn != nil {
		msg += "; the plugin reads the pod itself"
	}
	args := []any{"pid", peer.PID, "uid", peer.UID, "code", string(werr.Code), "error", werr.Message}
	if req.V == wire.WriteVersion {
		args = append(args, "write", true, "pod", req.Namespace+"/"+req.Name, "netns", req.Netns)
	}
	a.log.Warn(msg, args...)
	if conn != nil {
		// req.V is 0 (Answer's Version), Version or WriteVersion (wire.ReadRequest).
		_ = wire.Answer(conn, wire.Reply{V: req.V, Error: werr})
	}
}

// answer is the reply to a request, and the outcome it is counted under.
func (a *Agent) answer(ctx context.Context, req wire.Request) (wire.Reply, string) {
	if req.Command == wire.CommandDel {
		a.sandboxGone(req.ContainerID)
		return wire.Reply{}, "del"
	}
	api := &cacheAPI{a: a, uid: k8stypes.UID(req.UID)}
	var reply wire.Reply
	var err error
	if !a.synced.Load() {
		if a.kubelet == nil {
			return wire.Reply{Error: wire.Errorf(wire.CodeNotSynced, "the agent's watches have not synced yet")}, string(wire.CodeNotSynced)
		}
		if reply, err = api.unsyncedLookup(ctx, req.Namespace, req.Name); err != nil {
			return wire.Reply{Error: wire.Errorf(wire.CodeNotSynced, "the agent's watches have not synced yet, and %v", err)}, string(wire.CodeNotSynced)
		}
	} else if reply, err = api.lookup(ctx, req.Namespace, req.Name); err != nil {
		a.log.Debug("a plugin asked for a pod the watch does not hold", "pod", req.Namespace+"/"+req.Name, "error", err.Error())
		return wire.Reply{Error: wire.Errorf(wire.CodeNotSeen, "%v", err)}, string(wire.CodeNotSeen)
	}
	a.kubeletAnswered(req, reply)
	// Counted under "lookup" from the watch, "kubelet" from the kubelet's pods API.
	if reply.Source == wire.SourceKubelet {
		return reply, "kubelet"
	}
	return reply, "lookup"
}

// kubeletAnswered says, at info, that a pod came from the kubelet: it happens only while the
// watches cannot answer, which is worth seeing in the log (an API outage, an agent restart).
func (a *Agent) kubeletAnswered(req wire.Request, r wire.Reply) {
	if r.Source != wire.SourceKubelet {
		return
	}
	args := []any{"pod", req.Namespace + "/" + req.Name, "uid", req.UID, "command", req.Command, "synced", a.synced.Load()}
	if r.NamespaceError != "" {
		args = append(args, "namespace_error", r.NamespaceError)
	}
	a.log.Info("pod looked up from the kubelet's pods API", args...)
}
