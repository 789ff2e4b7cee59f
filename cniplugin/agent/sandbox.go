package agent

// Finding a running pod's network namespace.
//
// Through the CRI, the container runtime's own API for the kubelet (containerd, CRI-O): it lists
// every ready sandbox of a pod by the pod's UID, whenever and however the sandbox was created,
// including before linkerd-cni was chained, and its verbose status names the sandbox process's
// PID, in containerd 1.6 and 2.x alike. The namespace is then /proc/<pid>/ns/net in the node's
// /proc (mounted into the agent's container), which works wherever the runtime keeps its
// namespace files (netns_mounts_under_state_dir, CRI-O's). The alternatives fall short: libcni's
// cache records the namespace only since CNI 1.2 (containerd 1.6 links an older libcni), the
// runtime's state files are private and differ per runtime and version, and what the plugin
// reports at ADD misses every pod that started before the plugin was chained, or before an
// agent restart.
//
// A PID can be reused once the sandbox is gone, so before a namespace is used the process's
// cgroup must still name the sandbox, and the namespace must not be the agent's own (the node's:
// the agent runs in the host network namespace).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// Sandbox is a pod's running sandbox, as the agent reaches it.
type Sandbox struct {
	ID     string
	PodUID string
	// NetNS is the path the agent opens for the pod's network namespace.
	NetNS string
}

// ErrNoSandbox means the pod has no ready sandbox (not started yet, or stopping).
var ErrNoSandbox = errors.New("no ready sandbox")

// SandboxFinder finds the ready sandbox of a pod by its UID.
type SandboxFinder interface {
	Find(ctx context.Context, podUID string) (Sandbox, error)
}

// podUIDLabel is the label the kubelet puts on every sandbox it asks the runtime for.
const podUIDLabel = "io.kubernetes.pod.uid"

// CRI finds sandboxes through the container runtime's CRI socket.
type CRI struct {
	endpoint string
	proc     string
	conn     *grpc.ClientConn
	rt       runtimeapi.RuntimeServiceClient

	mu   sync.Mutex
	pids map[string]int // by sandbox ID: a sandbox's process does not change
	// down is when the runtime began refusing every call (zero while it answers).
	down time.Time
}

// criDownFor is how long the runtime may refuse every call before Healthy fails: the DaemonSet's
// container sees the socket file as it was when it started, so after a runtime restart only a
// new container reaches the runtime again.
const criDownFor = 2 * time.Minute

// Healthy fails when the runtime has refused every call for criDownFor.
func (c *CRI) Healthy() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.down.IsZero() && time.Since(c.down) > criDownFor {
		return fmt.Errorf("the CRI at %s has refused every call since %s", c.endpoint, c.down.Format(time.RFC3339))
	}
	return nil
}

// note records whether a call reached the runtime.
func (c *CRI) note(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case status.Code(err) != codes.Unavailable:
		c.down = time.Time{}
	case c.down.IsZero():
		c.down = time.Now()
	}
}

// NewCRI connects (lazily) to the runtime at endpoint (unix:///run/containerd/containerd.sock,
// or a plain path); proc is the node's /proc as this process sees it (/host/proc in the
// DaemonSet, /proc on the node itself).
func NewCRI(endpoint, proc string) (*CRI, error) {
	target := endpoint
	if strings.HasPrefix(target, "/") {
		target = "unix://" + target
	}
	if !strings.HasPrefix(target, "unix://") {
		return nil, fmt.Errorf("CRI endpoint %q: want unix:///path/to/socket", endpoint)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("CRI endpoint %s: %w", endpoint, err)
	}
	return &CRI{endpoint: endpoint, proc: proc, conn: conn, rt: runtimeapi.NewRuntimeServiceClient(conn), pids: map[string]int{}}, nil
}

// Close closes the connection.
func (c *CRI) Close() error { return c.conn.Close() }

// Find returns the newest ready sandbox of the pod with podUID.
func (c *CRI) Find(ctx context.Context, podUID string) (Sandbox, error) {
	resp, err := c.rt.ListPodSandbox(ctx, &runtimeapi.ListPodSandboxRequest{Filter: &runtimeapi.PodSandboxFilter{
		State:         &runtimeapi.PodSandboxStateValue{State: runtimeapi.PodSandboxState_SANDBOX_READY},
		LabelSelector: map[string]string{podUIDLabel: podUID},
	}})
	c.note(err)
	if err != nil {
		return Sandbox{}, fmt.Errorf("list the sandboxes of pod uid %s from the CRI at %s: %w", podUID, c.endpoint, err)
	}
	var newest *runtimeapi.PodSandbox
	for _, s := range resp.Items {
		if s.GetState() == runtimeapi.PodSandboxState_SANDBOX_READY && (newest == nil || s.CreatedAt > newest.CreatedAt) {
			newest = s
		}
	}
	if newest == nil {
		return Sandbox{}, ErrNoSandbox
	}
	pid, err := c.pid(ctx, newest.Id)
	if err != nil {
		return Sandbox{}, err
	}
	path, err := SandboxNetNS(c.proc, pid, newest.Id)
	if err != nil {
		c.mu.Lock()
		delete(c.pids, newest.Id)
		c.mu.Unlock()
		return Sandbox{}, err
	}
	return Sandbox{ID: newest.Id, PodUID: podUID, NetNS: path}, nil
}

func (c *CRI) pid(ctx context.Context, id string) (int, error) {
	c.mu.Lock()
	pid, ok := c.pids[id]
	c.mu.Unlock()
	if ok {
		return pid, nil
	}
	st, err := c.rt.PodSandboxStatus(ctx, &runtimeapi.PodSandboxStatusRequest{PodSandboxId: id, Verbose: true})
	if err != nil {
		return 0, fmt.Errorf("status of sandbox %s from the CRI at %s: %w", id, c.endpoint, err)
	}
	pid, err = SandboxPID(st.GetInfo())
	if err != nil {
		return 0, fmt.Errorf("sandbox %s: %w", id, err)
	}
	c.mu.Lock()
	if len(c.pids) > 4096 { // sandboxes long gone: start over
		clear(c.pids)
	}
	c.pids[id] = pid
	c.mu.Unlock()
	return pid, nil
}

// SandboxPID reads the sandbox process's PID from a verbose PodSandboxStatus's info: its "info"
// key holds JSON with "pid" in containerd 1.6 and 2.x (and CRI-O).
func SandboxPID(info map[string]string) (int, error) {
	raw, ok := info["info"]
	if !ok {
		return 0, errors.New(`the runtime's verbose sandbox status has no "info"`)
	}
	var v struct {
		Pid int `json:"pid"`
	}
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		return 0, fmt.Errorf("the runtime's sandbox info: %w", err)
	}
	if v.Pid <= 0 {
		return 0, fmt.Errorf("the runtime's sandbox info has no process (pid %d)", v.Pid)
	}
	return v.Pid, nil
}

// SandboxNetNS returns the network namespace of sandbox id's process pid, under proc, after
// checking that the process is still the sandbox's (its cgroup names the sandbox) and that the
// namespace is not this process's own.
func SandboxNetNS(proc string, pid int, id string) (string, error) {
	dir := filepath.Join(proc, strconv.Itoa(pid))
	cg, err := os.ReadFile(filepath.Join(dir, "cgroup"))
	if err != nil {
		return "", fmt.Errorf("sandbox %s, pid %d: %w", id, pid, err)
	}
	if !strings.Contains(string(cg), id) {
		return "", fmt.Errorf("sandbox %s: pid %d is no longer its process (its cgroup does not name it)", id, pid)
	}
	path := filepath.Join(dir, "ns", "net")
	var theirs, ours syscall.Stat_t
	if err := syscall.Stat(path, &theirs); err != nil {
		return "", fmt.Errorf("sandbox %s: %w", id, err)
	}
	if err := syscall.Stat("/proc/self/ns/net", &ours); err != nil {
		return "", fmt.Errorf("own network namespace: %w", err)
	}
	if theirs.Ino == ours.Ino && theirs.Dev == ours.Dev {
		return "", fmt.Errorf("sandbox %s: pid %d is in the agent's own network namespace (the node's); refusing it", id, pid)
	}
	return path, nil
}
