package agent

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	kubelettypes "k8s.io/kubelet/pkg/types"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// fakeRuntime is a CRI RuntimeService serving sandboxes as the runtimes do: ListPodSandbox honours
// the state and label filters, and the verbose status's "info" is the runtime's JSON
// (testdata/cri).
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	mu        sync.Mutex
	sandboxes []*runtimeapi.PodSandbox
	info      map[string]string // by sandbox ID
	statuses  int
}

func (f *fakeRuntime) ListPodSandbox(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
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
	f.mu.Lock()
	defer f.mu.Unlock()
	f.statuses++
	info := map[string]string{}
	if r.Verbose {
		info["info"] = f.info[r.PodSandboxId]
	}
	return &runtimeapi.PodSandboxStatusResponse{Status: &runtimeapi.PodSandboxStatus{Id: r.PodSandboxId}, Info: info}, nil
}

func (f *fakeRuntime) calls() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.statuses
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

func fixture(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "cri", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Where each runtime's verbose status says the namespace is: CRI-O's sandbox without an infra
// container has a path and no PID.
func TestParseSandboxInfo(t *testing.T) {
	tests := []struct {
		name string
		info map[string]string
		want nsRef
		err  string
	}{
		{"containerd 1.6", map[string]string{"info": fixture(t, "containerd-1.6.json")},
			nsRef{path: "/var/run/netns/cni-6a1f0b2c-93d4-e5f6-0718-293a4b5c6d7e", pid: 28411}, ""},
		{"containerd 2.x", map[string]string{"info": fixture(t, "containerd-2.x.json")},
			nsRef{path: "/var/run/netns/cni-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901", pid: 31877}, ""},
		{"containerd 2.x, the sandbox metadata alone", map[string]string{"info": `{"pid":7,"sandboxMetadata":{"Version":"v1","Metadata":{"NetNSPath":"/var/run/netns/cni-x"}}}`},
			nsRef{path: "/var/run/netns/cni-x", pid: 7}, ""},
		{"CRI-O with an infra container", map[string]string{"info": fixture(t, "crio.json")},
			nsRef{path: "/var/run/netns/8f1e2d3c-4b5a-4969-8877-665544332211", pid: 51234}, ""},
		{"CRI-O, drop_infra_ctr", map[string]string{"info": fixture(t, "crio-drop-infra.json")},
			nsRef{path: "/var/run/netns/8f1e2d3c-4b5a-4969-8877-665544332211"}, ""},
		{"hostNetwork: no network namespace of its own", map[string]string{"info": `{"pid":9,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"},{"type":"ipc"}]}}}`},
			nsRef{pid: 9}, ""},
		{"not verbose", map[string]string{}, nsRef{}, `the runtime's verbose sandbox status has no "info"`},
		{"not JSON", map[string]string{"info": "pid=17"}, nsRef{}, "the runtime's sandbox info: invalid character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseSandboxInfo(tt.info)
			if tt.err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), tt.err) {
					t.Fatalf("err = %v, want %q", err, tt.err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("parseSandboxInfo = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

// Only a plain name in the node's /var/run/netns (/run/netns is the same directory) is opened.
func TestNetNSName(t *testing.T) {
	for _, tt := range []struct {
		path, name string
		ok         bool
	}{
		{"/var/run/netns/cni-1", "cni-1", true},
		{"/run/netns/8f1e2d3c", "8f1e2d3c", true},
		{"/var/run/netns/../../etc/passwd", "", false},
		{"/run/containerd/io.containerd.grpc.v1.cri/netns/cni-1", "", false}, // netns_mounts_under_state_dir
		{"/var/run/netns/", "", false},
		{"", "", false},
	} {
		if name, ok := netnsName(tt.path); ok != tt.ok || (ok && name != tt.name) {
			t.Errorf("netnsName(%q) = %q, %t; want %q, %t", tt.path, name, ok, tt.name, tt.ok)
		}
	}
}

// inode is the inode of the namespace at path (a descriptor's too, through /proc/self/fd).
func inode(t *testing.T, path string) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st.Ino
}

const podUID = "0c1d2e3f-4a5b-4c6d-8e9f-a0b1c2d3e4f5"

func sandbox(id string, created int64, state runtimeapi.PodSandboxState) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{Id: id, CreatedAt: created, State: state, Labels: map[string]string{kubelettypes.KubernetesPodUIDLabel: podUID}}
}

// Each runtime's status leads to the pod's namespace, opened once and entered through a
// descriptor; CRI-O's sandbox without a process is found like the others.
func TestCRIFindsTheNamespaceFromTheRuntimesPath(t *testing.T) {
	netnstest.RequireRoot(t, "it mounts network namespaces under /var/run/netns")
	for _, tt := range []struct{ fixture, path string }{
		{"containerd-1.6.json", "/var/run/netns/cni-6a1f0b2c-93d4-e5f6-0718-293a4b5c6d7e"},
		{"containerd-2.x.json", "/var/run/netns/cni-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"},
		{"crio.json", "/var/run/netns/8f1e2d3c-4b5a-4969-8877-665544332211"},
		{"crio-drop-infra.json", "/var/run/netns/8f1e2d3c-4b5a-4969-8877-665544332211"},
	} {
		t.Run(tt.fixture, func(t *testing.T) {
			pod := netnstest.NewNS(t)
			// The runtime's path, renamed to the test's namespace; /run/netns is the same
			// directory.
			info := strings.ReplaceAll(fixture(t, tt.fixture), tt.path, strings.Replace(pod.Path(), "/var/run/", "/run/", 1))
			rt := &fakeRuntime{
				sandboxes: []*runtimeapi.PodSandbox{
					sandbox("old", 1, runtimeapi.PodSandboxState_SANDBOX_READY),
					sandbox("new", 3, runtimeapi.PodSandboxState_SANDBOX_READY),
					sandbox("stopped", 4, runtimeapi.PodSandboxState_SANDBOX_NOTREADY),
					{Id: "other-pod", CreatedAt: 9, State: runtimeapi.PodSandboxState_SANDBOX_READY, Labels: map[string]string{kubelettypes.KubernetesPodUIDLabel: "x"}},
				},
				info: map[string]string{"new": info},
			}
			cri, err := NewCRI(CRIOptions{Endpoint: serveCRI(t, rt), NetNSDir: filepath.Dir(pod.Path())})
			if err != nil {
				t.Fatal(err)
			}
			defer cri.Close()
			for range 2 {
				sb, err := cri.Find(context.Background(), podUID)
				if err != nil {
					t.Fatal(err)
				}
				if sb.ID != "new" || sb.PodUID != podUID || !strings.HasPrefix(sb.NetNS, "/proc/self/fd/") || inode(t, sb.NetNS) != inode(t, pod.Path()) {
					t.Errorf("Find = %+v, want sandbox new entered through a descriptor of %s", sb, pod.Path())
				}
				if err := netnsutil.Do(sb.NetNS, func() error { return nil }); err != nil {
					t.Errorf("enter %s: %v", sb.NetNS, err)
				}
				if err := sb.Close(); err != nil {
					t.Error(err)
				}
			}
			if rt.calls() != 1 {
				t.Errorf("%d status calls for one sandbox, want 1 (its namespace is held)", rt.calls())
			}
			if _, err := cri.Find(context.Background(), "no-such-pod"); !errors.Is(err, ErrNoSandbox) {
				t.Errorf("Find of a pod without a sandbox = %v, want ErrNoSandbox", err)
			}
		})
	}
}

// held lists the sandboxes whose namespace the CRI holds.
func (c *CRI) heldIDs() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var ids []string
	for id := range c.held {
		ids = append(ids, id)
	}
	return ids
}

// A namespace is let go when its sandbox is gone: DEL reported, pod deleted, not ready, or
// replaced by a newer sandbox; what comes next is asked of the runtime again.
func TestCRILetsGoOfGoneSandboxes(t *testing.T) {
	netnstest.RequireRoot(t, "it mounts network namespaces under /var/run/netns")
	pod := netnstest.NewNS(t)
	info := `{"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"` + pod.Path() + `"}]}}}`
	rt := &fakeRuntime{sandboxes: []*runtimeapi.PodSandbox{sandbox("a", 1, runtimeapi.PodSandboxState_SANDBOX_READY)},
		info: map[string]string{"a": info, "b": info}}
	cri, err := NewCRI(CRIOptions{Endpoint: serveCRI(t, rt), NetNSDir: filepath.Dir(pod.Path())})
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	find := func(want string) {
		t.Helper()
		sb, err := cri.Find(context.Background(), podUID)
		if err != nil || sb.ID != want {
			t.Fatalf("Find = %+v, %v; want sandbox %s", sb, err, want)
		}
		sb.Close()
	}
	steps := []struct {
		name   string
		gone   func()
		find   string // the sandbox then found; "" for none
		held   string // what is held after
		status int    // status calls so far
	}{
		{"found", func() {}, "a", "a", 1},
		{"the plugin's DEL", func() { cri.Forget("", "a") }, "a", "a", 2},
		{"the pod deleted", func() { cri.Forget(podUID, "") }, "a", "a", 3},
		{"not ready", func() { rt.sandboxes[0].State = runtimeapi.PodSandboxState_SANDBOX_NOTREADY }, "", "", 3},
		{"a newer sandbox", func() {
			rt.sandboxes[0].State = runtimeapi.PodSandboxState_SANDBOX_READY
			rt.sandboxes = append(rt.sandboxes, sandbox("b", 2, runtimeapi.PodSandboxState_SANDBOX_READY))
		}, "b", "b", 4},
	}
	for _, s := range steps {
		s.gone()
		if s.find != "" {
			find(s.find)
		} else if _, err := cri.Find(context.Background(), podUID); !errors.Is(err, ErrNoSandbox) {
			t.Fatalf("%s: Find = %v, want ErrNoSandbox", s.name, err)
		}
		if got := strings.Join(cri.heldIDs(), ","); got != s.held || rt.calls() != s.status {
			t.Errorf("%s: held %q after %d status calls, want %q after %d", s.name, got, rt.calls(), s.held, s.status)
		}
	}
}

// A sandbox with no namespace under /var/run/netns is not audited without the PID fallback (said
// once); with it, its process leads to the namespace, as long as the process's cgroup names the
// sandbox and the namespace is not the agent's own.
func TestCRIPIDFallback(t *testing.T) {
	netnstest.RequireRoot(t, "it starts a process in a network namespace of its own")
	pod := netnstest.NewNS(t)
	var child *exec.Cmd
	if err := pod.Do(func() error { child = exec.Command("sleep", "60"); return child.Start() }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	cg, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Skip("no /proc/self/cgroup")
	}
	line := strings.TrimSpace(strings.Split(string(cg), "\n")[0])
	inCgroup := line[strings.LastIndex(line, ":")+1:] // what the child's cgroup names, as the runtime's would its sandbox's
	pidInfo := func(pid int) string {
		return `{"pid":` + strconv.Itoa(pid) + `,"runtimeSpec":{"linux":{"namespaces":[{"type":"pid"}]}}}`
	}
	tests := []struct {
		name     string
		id       string
		info     string
		fallback bool
		err      string
		logLines int // over two audits: said once per sandbox
	}{
		{"no path, no fallback", inCgroup, pidInfo(child.Process.Pid), false, "the runtime names no network namespace under /var/run/netns", 1},
		{"a path elsewhere, no fallback", inCgroup, `{"pid":1,"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"/run/containerd/netns/cni-1"}]}}}`, false, "the runtime names no network namespace", 1},
		{"the fallback", inCgroup, pidInfo(child.Process.Pid), true, "", 1},
		{"a reused PID", "3f9a6c1e7b2d", pidInfo(child.Process.Pid), true, "is no longer its process (its cgroup does not name it)", 0},
		{"the agent's own namespace", inCgroup, pidInfo(os.Getpid()), true, "the agent's own network namespace (the node's); refusing it", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rt := &fakeRuntime{sandboxes: []*runtimeapi.PodSandbox{sandbox(tt.id, 1, runtimeapi.PodSandboxState_SANDBOX_READY)},
				info: map[string]string{tt.id: tt.info}}
			var log strings.Builder
			opts := CRIOptions{Endpoint: serveCRI(t, rt), NetNSDir: t.TempDir(), Log: slog.New(slog.NewTextHandler(&log, nil))}
			if tt.fallback {
				opts.HostProc = "/proc"
			}
			cri, err := NewCRI(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer cri.Close()
			for range 2 {
				sb, err := cri.Find(context.Background(), podUID)
				if tt.err != "" {
					if err == nil || !strings.Contains(err.Error(), tt.err) {
						t.Fatalf("Find = %+v, %v; want an error with %q", sb, err, tt.err)
					}
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				if inode(t, sb.NetNS) != inode(t, pod.Path()) {
					t.Errorf("Find entered %s, not the child's namespace", sb.Where)
				}
				sb.Close()
			}
			if n := strings.Count(log.String(), "\n"); n != tt.logLines {
				t.Errorf("%d log lines over two audits, want %d:\n%s", n, tt.logLines, log.String())
			}
		})
	}
}

// What is at the runtime's path must be a network namespace.
func TestCRIRefusesWhatIsNotANamespace(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cni-1"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	rt := &fakeRuntime{sandboxes: []*runtimeapi.PodSandbox{sandbox("a", 1, runtimeapi.PodSandboxState_SANDBOX_READY)},
		info: map[string]string{"a": `{"runtimeSpec":{"linux":{"namespaces":[{"type":"network","path":"/var/run/netns/cni-1"}]}}}`}}
	cri, err := NewCRI(CRIOptions{Endpoint: serveCRI(t, rt), NetNSDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer cri.Close()
	want := "sandbox a: " + filepath.Join(dir, "cni-1") + ": a file, not a namespace"
	if _, err := cri.Find(context.Background(), podUID); err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Find = %v, want %q", err, want)
	}
	if len(cri.heldIDs()) != 0 {
		t.Errorf("held %v after a refusal, want nothing (asked again next time)", cri.heldIDs())
	}
}

func TestNewCRIRefusesOtherEndpoints(t *testing.T) {
	if _, err := NewCRI(CRIOptions{Endpoint: "tcp://127.0.0.1:1234"}); err == nil || err.Error() != `CRI endpoint "tcp://127.0.0.1:1234": want unix:///path/to/socket` {
		t.Errorf("NewCRI = %v", err)
	}
}

// A runtime that refuses every call for two minutes through a socket still there (a stale one,
// after a runtime restart) fails Healthy (hence /live): only a new container sees the new socket.
// One answered call clears it. A socket that is not there at all is said once, and never fails
// Healthy: a restart would not bring it.
func TestCRIHealthy(t *testing.T) {
	stale := filepath.Join(t.TempDir(), "stale.sock")
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: stale, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
	live := serveCRI(t, &fakeRuntime{})
	for _, tt := range []struct {
		name, endpoint string
		unhealthy      bool
		logged         string
	}{
		{"answering", live, false, ""},
		{"a stale socket", "unix://" + stale, true, ""},
		{"no socket", "unix://" + filepath.Join(t.TempDir(), "gone.sock"), false, "the CRI socket is missing"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var log strings.Builder
			cri, err := NewCRI(CRIOptions{Endpoint: tt.endpoint, Log: slog.New(slog.NewTextHandler(&log, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer cri.Close()
			for range 2 {
				_, _ = cri.Find(context.Background(), "x")
			}
			if err := cri.Healthy(); err != nil {
				t.Fatalf("Healthy at once = %v", err)
			}
			cri.mu.Lock()
			if !cri.down.IsZero() {
				cri.down = cri.down.Add(-criDownFor - time.Second)
			}
			cri.mu.Unlock()
			if err := cri.Healthy(); (err != nil) != tt.unhealthy || (err != nil && !strings.Contains(err.Error(), "has refused every call since")) {
				t.Errorf("Healthy after %s of refusals = %v, want unhealthy %t", criDownFor, err, tt.unhealthy)
			}
			if strings.Count(log.String(), "\n") != min(1, len(tt.logged)) || !strings.Contains(log.String(), tt.logged) {
				t.Errorf("log over two calls:\n%s\nwant one line with %q", log.String(), tt.logged)
			}
		})
	}
}
