package agent

// Finding a running pod's network namespace through the CRI, the runtime's own API for the
// kubelet (containerd, CRI-O): it lists every ready sandbox of a pod by the pod's UID, however the
// sandbox was created, and its verbose status names the sandbox's network namespace by path
// (testdata/cri holds each runtime's). The runtimes keep it under the node's /var/run/netns, which
// the DaemonSet mounts read-only at the same path, with HostToContainer propagation so that
// namespaces made after the agent started appear.
//
// Each sandbox's namespace is opened once, checked and its descriptor kept while the runtime
// reports the sandbox ready: audits enter it through that descriptor, never by path again, so
// nothing put at the path later is ever entered.
//
// Where the status names no namespace under /var/run/netns, the sandbox's process is the
// fallback, only with --pid-fallback (see openByPID). Without it such a pod is not audited, and
// the agent says so once per sandbox.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubelettypes "k8s.io/kubelet/pkg/types"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
)

// Sandbox is a pod's running sandbox, as the agent reaches it.
type Sandbox struct {
	ID     string
	PodUID string
	// NetNS is the path the agent enters the pod's network namespace by: /proc/self/fd/N, a
	// descriptor held for this one use (Close releases it), or a plain path (tests).
	NetNS string
	// Where names the namespace in messages: the runtime's path, or the sandbox's process.
	Where string

	file *os.File
}

// Close releases the descriptor NetNS names.
func (s Sandbox) Close() error {
	if s.file == nil {
		return nil
	}
	return s.file.Close()
}

// ErrNoSandbox means the pod has no ready sandbox (not started yet, or stopping).
var ErrNoSandbox = errors.New("no ready sandbox")

// ErrNoNetNS means the runtime names no network namespace the agent can open for the sandbox
// (a hostNetwork pod, a namespace kept outside /var/run/netns), and the PID fallback is off.
var ErrNoNetNS = errors.New("the runtime names no network namespace under /var/run/netns for the sandbox")

// SandboxFinder finds the ready sandbox of a pod by its UID.
type SandboxFinder interface {
	Find(ctx context.Context, podUID string) (Sandbox, error)
	// Forget drops what is held for the pod's sandboxes (podUID) or for one sandbox (id); either
	// may be empty.
	Forget(podUID, id string)
}

// CRIOptions configure NewCRI.
type CRIOptions struct {
	// Endpoint is the runtime's CRI socket: unix:///run/containerd/containerd.sock, or a path.
	Endpoint string
	// NetNSDir is the node's /var/run/netns as this process sees it.
	NetNSDir string
	// HostProc, when set, is the node's /proc as this process sees it: the PID fallback.
	HostProc string
	// Log receives what is said once per sandbox; nil discards it.
	Log *slog.Logger
}

// CRI finds sandboxes through the container runtime's CRI socket.
type CRI struct {
	opts   CRIOptions
	socket string
	conn   *grpc.ClientConn
	rt     runtimeapi.RuntimeServiceClient

	mu sync.Mutex
	// held is each sandbox's namespace, open, by sandbox ID: its file is nil when none can be
	// opened (said once), and its NetNS is empty (take gives each caller a descriptor of its own).
	held map[string]Sandbox
	// down is when the runtime began refusing every call (zero while it answers).
	down    time.Time
	missing sync.Once
}

// criDownFor is how long the runtime may refuse every call before Healthy fails: the DaemonSet's
// container sees the socket file as it was when it started, so after a runtime restart only a
// new container reaches the runtime again.
const criDownFor = 2 * time.Minute

// Healthy fails when the runtime has refused every call for criDownFor while its socket is there
// (a stale one: a new container sees the new socket). A socket that is not there at all (a node
// whose runtime keeps it elsewhere) stays missing however often the container restarts: that is
// logged, not failed on.
func (c *CRI) Healthy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.down.IsZero() || time.Since(c.down) <= criDownFor || !c.socketThere() {
		return nil
	}
	return fmt.Errorf("the CRI at %s has refused every call since %s", c.opts.Endpoint, c.down.Format(time.RFC3339))
}

func (c *CRI) socketThere() bool {
	fi, err := os.Stat(c.socket)
	return err == nil && fi.Mode().Type() == os.ModeSocket
}

// note records whether a call reached the runtime.
func (c *CRI) note(err error) {
	if status.Code(err) == codes.Unavailable && !c.socketThere() {
		c.missing.Do(func() {
			c.opts.Log.Error("the CRI socket is missing: no pod's network namespace can be found, so nothing is audited; set agent.criSocket to the runtime's socket",
				"socket", c.socket, "error", err.Error())
		})
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case status.Code(err) != codes.Unavailable:
		c.down = time.Time{}
	case c.down.IsZero():
		c.down = time.Now()
	}
}

// NewCRI connects (lazily) to the runtime at opts.Endpoint.
func NewCRI(opts CRIOptions) (*CRI, error) {
	socket := strings.TrimPrefix(opts.Endpoint, "unix://")
	if !strings.HasPrefix(socket, "/") {
		return nil, fmt.Errorf("CRI endpoint %q: want unix:///path/to/socket", opts.Endpoint)
	}
	conn, err := grpc.NewClient("unix://"+socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %s: %w", opts.Endpoint, err)
	}
	opts.Log = cmp.Or(opts.Log, slog.New(slog.DiscardHandler))
	return &CRI{opts: opts, socket: socket, conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn), held: map[string]Sandbox{}}, nil
}

// Close closes the connection and every namespace held.
func (c *CRI) Close() error {
	c.Forget("", "")
	return c.conn.Close()
}

// Forget closes the namespaces held for the pod with podUID, or for sandbox id; with both empty,
// every one.
func (c *CRI) Forget(podUID, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop(func(k string, h Sandbox) bool {
		return (podUID == "" && id == "") || (podUID != "" && h.PodUID == podUID) || k == id
	})
}

// drop closes and forgets the held namespaces of the sandboxes that match; c.mu is held.
func (c *CRI) drop(match func(id string, h Sandbox) bool) {
	for k, h := range c.held {
		if match(k, h) {
			h.Close()
			delete(c.held, k)
		}
	}
}

// Find returns the newest ready sandbox of the pod with podUID; Close the Sandbox once done.
func (c *CRI) Find(ctx context.Context, podUID string) (Sandbox, error) {
	resp, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{kubelettypes.KubernetesPodUIDLabel: podUID},
	}})
	c.note(err)
	if err != nil {
		return Sandbox{}, fmt.Errorf("list the sandboxes of pod uid %s from the CRI at %s: %w", podUID, c.opts.Endpoint, err)
	}
	var newest *runtimeapi.PodSandbox
	for _, s := range resp.Items {
		if s.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY && (newest == nil || s.CreatedAt > newest.CreatedAt) {
			newest = s
		}
	}
	if newest == nil {
		c.Forget(podUID, "")
		return Sandbox{}, ErrNoSandbox
	}
	if sb, ok, err := c.take(podUID, newest.Id); ok {
		return sb, err
	}
	h, err := c.open(ctx, podUID, newest.Id)
	if err != nil {
		return Sandbox{}, err
	}
	c.mu.Lock()
	if _, raced := c.held[newest.Id]; raced {
		h.Close()
	} else {
		c.held[newest.Id] = h
	}
	c.mu.Unlock()
	sb, _, err := c.take(podUID, newest.Id)
	return sb, err
}

// take returns sandbox id with a descriptor of its own for its namespace, if it is held, after
// dropping the pod's other sandboxes (no longer the newest ready one).
func (c *CRI) take(podUID, id string) (Sandbox, bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.drop(func(k string, h Sandbox) bool { return h.PodUID == podUID && k != id })
	h, ok := c.held[id]
	switch {
	case !ok:
		return Sandbox{}, false, nil
	case h.file == nil:
		return Sandbox{}, true, fmt.Errorf("sandbox %s: %w", id, ErrNoNetNS)
	}
	fd, err := unix.FcntlInt(h.file.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return Sandbox{}, true, fmt.Errorf("sandbox %s: duplicate the descriptor of its network namespace: %w", id, err)
	}
	h.NetNS, h.file = "/proc/self/fd/"+strconv.Itoa(fd), os.NewFile(uintptr(fd), h.Where)
	return h, true, nil
}

// open asks the runtime where sandbox id's network namespace is, and opens it.
func (c *CRI) open(ctx context.Context, podUID, id string) (Sandbox, error) {
	st, err := c.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return Sandbox{}, fmt.Errorf("status of sandbox %s from the CRI at %s: %w", id, c.opts.Endpoint, err)
	}
	ref, err := parseSandboxInfo(st.GetInfo())
	if err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	sb := Sandbox{ID: id, PodUID: podUID, Where: ref.path}
	log := c.opts.Log.With("sandbox", id, "uid", podUID, "runtime_path", ref.path, "pid", ref.pid)
	switch name, ok := netnsName(ref.path); {
	case ok:
		sb.file, err = openNetNS(filepath.Join(c.opts.NetNSDir, name))
	case c.opts.HostProc != "" && ref.pid > 0:
		sb.Where = "the network namespace of pid " + strconv.Itoa(ref.pid)
		if sb.file, err = openByPID(c.opts.HostProc, ref.pid, id); err == nil {
			log.Info("found the sandbox's network namespace through its process (--pid-fallback)")
		}
	default:
		log.Warn("not auditing this sandbox: " + ErrNoNetNS.Error() + " (a hostNetwork pod, or a runtime keeping it elsewhere: see agent.pidFallback)")
	}
	if err != nil {
		return Sandbox{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	return sb, nil
}

// nsRef is where a runtime says a sandbox's network namespace is.
type nsRef struct {
	path string // "" when none is named
	pid  int    // the sandbox's process; 0 without one (CRI-O's drop_infra_ctr)
}

// sandboxInfo is what the agent reads of the "info" JSON of a verbose PodSandboxStatus:
// containerd's SandboxInfo (1.6 and 2.x; 2.x adds sandboxMetadata) and CRI-O's (image, pid and
// runtimeSpec; only runtimeSpec for a sandbox without infra container).
type sandboxInfo struct {
	Pid         int `json:"pid"`
	RuntimeSpec struct {
		Linux struct {
			Namespaces []struct {
				Type string `json:"type"`
				Path string `json:"path"`
			} `json:"namespaces"`
		} `json:"linux"`
	} `json:"runtimeSpec"`
	SandboxMetadata struct {
		Metadata struct {
			NetNSPath string `json:"NetNSPath"`
		} `json:"Metadata"`
	} `json:"sandboxMetadata"`
}

// parseSandboxInfo reads where the sandbox's network namespace is from a verbose
// PodSandboxStatus's info.
func parseSandboxInfo(info map[string]string) (nsRef, error) {
	raw, ok := info["info"]
	if !ok {
		return nsRef{}, errors.New(`the runtime's verbose sandbox status has no "info"`)
	}
	var v sandboxInfo
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return nsRef{}, fmt.Errorf("the runtime's sandbox info: %w", err)
	}
	ref := nsRef{path: v.SandboxMetadata.Metadata.NetNSPath, pid: max(v.Pid, 0)}
	for _, ns := range v.RuntimeSpec.Linux.Namespaces {
		if ns.Type == "network" && ns.Path != "" {
			ref.path = ns.Path
		}
	}
	return ref, nil
}

// netnsName returns the name of a namespace the runtime keeps in the node's /var/run/netns (or
// /run/netns, the same directory), the directory mounted into the agent's container.
func netnsName(path string) (string, bool) {
	dir, name := filepath.Split(filepath.Clean(path))
	dir = filepath.Clean(dir)
	return name, (dir == "/var/run/netns" || dir == "/run/netns") && name != ""
}

// openNetNS opens the network namespace at path and checks it.
func openNetNS(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	if err := checkPodNetNS(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}

// openByPID opens the network namespace of process pid under proc (the node's /proc: SYS_PTRACE
// for a process of another user), after checking that the process is still sandbox id's: both
// are read through one descriptor of /proc/<pid>, which a reused PID would not reach.
func openByPID(proc string, pid int, id string) (*os.File, error) {
	dir, err := os.Open(filepath.Join(proc, strconv.Itoa(pid)))
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	fd, err := unix.Openat(int(dir.Fd()), "cgroup", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("pid %d: open its cgroup: %w", pid, err)
	}
	cgf := os.NewFile(uintptr(fd), "cgroup")
	cg, err := io.ReadAll(cgf)
	cgf.Close()
	if err != nil {
		return nil, fmt.Errorf("pid %d: read its cgroup: %w", pid, err)
	}
	if !strings.Contains(string(cg), id) {
		return nil, fmt.Errorf("pid %d is no longer its process (its cgroup does not name it)", pid)
	}
	fd, err = unix.Openat(int(dir.Fd()), "ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("pid %d: open its network namespace: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir.Name(), "ns", "net"))
	if err := checkPodNetNS(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("pid %d: %w", pid, err)
	}
	return f, nil
}

// checkPodNetNS refuses what is not a network namespace, and the agent's own (the node's: the
// agent runs in the host network namespace), whatever the runtime said.
func checkPodNetNS(f *os.File) error {
	if err := netnsutil.CheckNetNSFile(f); err != nil {
		return err
	}
	theirs, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat: %w", err)
	}
	ours, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return fmt.Errorf("own network namespace: %w", err)
	}
	if os.SameFile(theirs, ours) {
		return errors.New("the agent's own network namespace (the node's); refusing it")
	}
	return nil
}
