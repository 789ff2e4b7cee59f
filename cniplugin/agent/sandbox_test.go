package agent

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRuntime is a CRI RuntimeService serving sandboxes as containerd does: ListPodSandbox honours
// the state and label filters, and the verbose status's "info" is containerd's SandboxInfo JSON
// (pid, processStatus, netNamespaceClosed, runtimeSpec...), of which the agent reads the pid.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	sandboxes []*runtimeapi.PodSandbox
	info      map[string]string // by sandbox ID
	statuses  int
}

func (f *fakeRuntime) ListPodSandbox(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	var out []*runtimeapi.PodSandbox
	for _, s := range f.sandboxes {
		if st := r.GetFilter().GetState(); st != nil && st.State != s.State {
			continue
		}
		match := true
		for k, v := range r.GetFilter().GetLabelSelector() {
			match = match && s.Labels[k] == v
		}
		if match {
			out = append(out, s)
		}
	}
	return &runtimeapi.ListPodSandboxResponse{Items: out}, nil
}

func (f *fakeRuntime) PodSandboxStatus(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	f.statuses++
	info := map[string]string{}
	if r.Verbose {
		info["info"] = f.info[r.PodSandboxId]
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: r.PodSandboxId}, Info: info}, nil
}

func serveCRI(t *testing.T, rt *fakeRuntime) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, rt)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return "unix://" + sock
}

// fakeProc lays out /proc/<pid>/cgroup and /proc/<pid>/ns/net for a sandbox process.
func fakeProc(t *testing.T, proc string, pid int, cgroup string) {
	t.Helper()
	dir := filepath.Join(proc, strconv.Itoa(pid))
	if err := os.MkdirAll(filepath.Join(dir, "ns"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cgroup), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ns", "net"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

const containerdInfo = `{"pid":%d,"processStatus":"running","netNamespaceClosed":false,"image":"e2e.test/pause:1",` +
	`"snapshotKey":"k","snapshotter":"overlayfs","runtimeHandler":"","runtimeType":"io.containerd.runc.v2",` +
	`"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"network","path":"/var/run/netns/cni-1"}]}}}`

func TestCRIFindsTheNewestReadySandbox(t *testing.T) {
	const uid = "0c1d2e3f-4a5b-4c6d-8e9f-a0b1c2d3e4f5"
	sb := func(id string, created int64, state runtimeapi.PodSandboxState) *runtimeapi.PodSandbox {
		return &runtimeapi.PodSandbox{Id: id, CreatedAt: created, State: state, Labels: map[string]string{podUIDLabel: uid}}
	}
	rt := &fakeRuntime{
		sandboxes: []*runtimeapi.PodSandbox{
			sb("old", 1, runtimeapi.PodSandboxState_SANDBOX_READY),
			sb("new", 3, runtimeapi.PodSandboxState_SANDBOX_READY),
			sb("stopped", 4, runtimeapi.PodSandboxState_SANDBOX_NOTREADY),
			{Id: "other-pod", CreatedAt: 9, State: runtimeapi.PodSandboxState_SANDBOX_READY, Labels: map[string]string{podUIDLabel: "x"}},
		},
		info: map[string]string{"new": strings.Replace(containerdInfo, "%d", "4242", 1)},
	}
	proc := t.TempDir()
	// The cgroup path names the sandbox, as both cgroup drivers do.
	fakeProc(t, proc, 4242, "0::/kubepods/besteffort/pod"+uid+"/new\n")
	cri, err := NewCRI(serveCRI(t, rt), proc)
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	for range 2 {
		got, err := cri.Find(context.Background(), uid)
		if err != nil {
			t.Fatal(err)
		}
		if want := (Sandbox{ID: "new", PodUID: uid, NetNS: filepath.Join(proc, "4242", "ns", "net")}); got != want {
			t.Errorf("Find = %+v, want %+v", got, want)
		}
	}
	if rt.statuses != 1 {
		t.Errorf("%d status calls for one sandbox, want 1 (its PID is cached)", rt.statuses)
	}
	if _, err := cri.Find(context.Background(), "no-such-pod"); !errors.Is(err, ErrNoSandbox) {
		t.Errorf("Find of a pod without a sandbox = %v, want ErrNoSandbox", err)
	}
	// The PID was reused by another process: refused, and asked again next time.
	fakeProc(t, proc, 4242, "0::/user.slice/session-1.scope\n")
	if _, err := cri.Find(context.Background(), uid); err == nil || !strings.Contains(err.Error(), "sandbox new: pid 4242 is no longer its process") {
		t.Errorf("Find after PID reuse = %v", err)
	}
	_, _ = cri.Find(context.Background(), uid)
	if rt.statuses != 2 {
		t.Errorf("after a refused PID, %d status calls, want 2", rt.statuses)
	}
}

func TestSandboxPID(t *testing.T) {
	tests := []struct {
		name string
		info map[string]string
		pid  int
		err  string
	}{
		{"containerd", map[string]string{"info": strings.Replace(containerdInfo, "%d", "17", 1)}, 17, ""},
		{"not verbose", map[string]string{}, 0, `the runtime's verbose sandbox status has no "info"`},
		{"not JSON", map[string]string{"info": "pid=17"}, 0, "the runtime's sandbox info: invalid character"},
		{"no process", map[string]string{"info": `{"pid":0,"processStatus":"deleted"}`}, 0, "the runtime's sandbox info has no process (pid 0)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pid, err := SandboxPID(tt.info)
			if tt.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || pid != tt.pid {
				t.Fatalf("SandboxPID = %d, %v; want %d", pid, err, tt.pid)
			}
		})
	}
}

// The agent's own network namespace (the node's) is never a sandbox's, whatever the runtime says.
func TestSandboxNetNSRefusesTheNodes(t *testing.T) {
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skip("no /proc/self/cgroup")
	}
	line := strings.TrimSpace(strings.Split(string(cg), "\n")[0])
	id := line[strings.LastIndex(line, ":")+1:] // a string this process's cgroup contains
	_, err = SandboxNetNS("/proc", os.Getpid(), id)
	if err == nil || !strings.Contains(err.Error(), "is in the agent's own network namespace (the node's); refusing it") {
		t.Errorf("SandboxNetNS of this process = %v, want a refusal", err)
	}
}

func TestNewCRIRefusesOtherEndpoints(t *testing.T) {
	if _, err := NewCRI("tcp://127.0.0.1:1234", "/proc"); err == nil || err.Error() != `CRI endpoint "tcp://127.0.0.1:1234": want unix:///path/to/socket` {
		t.Errorf("NewCRI = %v", err)
	}
}

// A runtime that refuses every call for two minutes fails Healthy (hence /live): after a runtime
// restart only a new container sees the new socket. One answered call clears it.
func TestCRIHealthy(t *testing.T) {
	rt := &fakeRuntime{}
	endpoint := serveCRI(t, rt)
	cri, err := NewCRI(endpoint, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	if _, err := cri.Find(context.Background(), "x"); !errors.Is(err, ErrNoSandbox) || cri.Healthy() != nil {
		t.Fatalf("Find = %v, Healthy = %v", err, cri.Healthy())
	}
	gone, err := NewCRI("unix://"+filepath.Join(t.TempDir(), "gone.sock"), t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	if _, err := gone.Find(context.Background(), "x"); err == nil || gone.Healthy() != nil {
		t.Fatalf("Find on a missing socket = %v, Healthy = %v; want an error, then healthy for now", err, gone.Healthy())
	}
	gone.down = gone.down.Add(-criDownFor - time.Second)
	if err := gone.Healthy(); err == nil || !strings.Contains(err.Error(), "has refused every call since") {
		t.Errorf("Healthy after %s of refusals = %v", criDownFor, err)
	}
}
