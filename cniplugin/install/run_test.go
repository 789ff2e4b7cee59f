package install

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/kubemesh/proxy-init/test/cnitest"
)

// testCA is a syntactically valid PEM block; the installer only embeds it.
const testCA = "-----BEGIN CERTIFICATE-----\nMIIBdummyCAforInstallerTests\n-----END CERTIFICATE-----\n"

// host is a temp dir laid out like the installer container's mounts: the
// node's root under host/, the image's bin dir, and a service-account
// volume written the way the kubelet's atomic writer writes it.
type host struct {
	root, netDir, binDir, imageBin, saDir string
	binary                                []byte // the image's plugin
	cfg                                   Config

	mu     sync.Mutex
	writes map[string]int // by base name, from the installer's write hook
	order  []string       // the hook's paths, in order
}

func newHost(t *testing.T) *host {
	t.Helper()
	root := t.TempDir()
	h := &host{
		root:     root,
		netDir:   filepath.Join(root, "host/etc/cni/net.d"),
		binDir:   filepath.Join(root, "host/opt/cni/bin"),
		imageBin: filepath.Join(root, "image/opt/cni/bin"),
		saDir:    filepath.Join(root, "sa"),
		writes:   map[string]int{},
	}
	for _, d := range []string{h.netDir, h.binDir, h.imageBin, h.saDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	h.binary = make([]byte, 64*1024)
	_, _ = rand.Read(h.binary)
	if err := os.WriteFile(filepath.Join(h.imageBin, "linkerd-cni"), h.binary, 0o755); err != nil {
		t.Fatal(err)
	}
	// Another CNI's binary, which must survive.
	if err := os.WriteFile(filepath.Join(h.binDir, "calico"), []byte("calico"), 0o755); err != nil {
		t.Fatal(err)
	}
	h.projectSA(t, map[string]string{"token": "token-1", "ca.crt": testCA, "namespace": "linkerd-cni"})
	h.cfg = Config{
		DestNetDir:        "/etc/cni/net.d",
		DestBinDir:        "/opt/cni/bin",
		MountPrefix:       filepath.Join(root, "host"),
		ContainerBinDir:   h.imageBin,
		ServiceAccountDir: h.saDir,
		ServiceHost:       "10.96.0.1",
		ServicePort:       "443",
		Namespace:         "linkerd-cni",
		AdminAddr:         "127.0.0.1:0",
		Debounce:          20 * time.Millisecond,
		// Long, so the tests prove that the watches, not the resync, act.
		Resync:          time.Hour,
		PluginLogOutput: io.Discard,
		onWrite: func(p string) {
			h.mu.Lock()
			h.writes[filepath.Base(p)]++
			h.order = append(h.order, p)
			h.mu.Unlock()
		},
	}
	return h
}

func (h *host) writeCount(name string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.writes[name]
}

// projectSA updates the service-account volume like the kubelet's
// AtomicWriter (pkg/volume/util/atomic_writer.go): the files go into a new
// "..<timestamp>.<random>" dir, a "..data_tmp" symlink to it is renamed
// over "..data", the visible names are symlinks into "..data", and the old
// dir is removed.
func (h *host) projectSA(t *testing.T, files map[string]string) {
	t.Helper()
	ts, err := os.MkdirTemp(h.saDir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(ts, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data := filepath.Join(h.saDir, "..data")
	old, _ := os.Readlink(data)
	tmp := filepath.Join(h.saDir, "..data_tmp")
	if err := os.Symlink(filepath.Base(ts), tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, data); err != nil {
		t.Fatal(err)
	}
	for name := range files {
		link := filepath.Join(h.saDir, name)
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(filepath.Join("..data", name), link); err != nil {
				t.Fatal(err)
			}
		}
	}
	if old != "" {
		if err := os.RemoveAll(filepath.Join(h.saDir, old)); err != nil {
			t.Fatal(err)
		}
	}
}

func (h *host) write(t *testing.T, name, content string) {
	t.Helper()
	if err := os.WriteFile(filepath.Join(h.netDir, name), []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// replace writes a file the way Calico and Cilium do: a temp file renamed
// over the old one.
func (h *host) replace(t *testing.T, name, content string) {
	t.Helper()
	tmp := filepath.Join(h.netDir, ".primary-tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(h.netDir, name)); err != nil {
		t.Fatal(err)
	}
}

func (h *host) read(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(h.netDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// running is an installer started by start.
type running struct {
	cancel context.CancelFunc
	done   chan error
	admin  string
	logs   *cnitest.SyncBuffer
}

// start runs the installer until the test stops it or ends.
func (h *host) start(t *testing.T) *running {
	t.Helper()
	r := &running{done: make(chan error, 1), logs: &cnitest.SyncBuffer{}}
	addrCh := make(chan string, 1)
	cfg := h.cfg
	cfg.onAdminListen = func(a net.Addr) { addrCh <- a.String() }
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	log := slog.New(slog.NewTextHandler(io.MultiWriter(r.logs, testWriter{t}), nil))
	go func() { r.done <- Run(ctx, cfg, log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			t.Error("installer did not stop within 10s")
		}
	})
	select {
	case r.admin = <-addrCh:
	case err := <-r.done:
		t.Fatalf("installer exited at start: %v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("admin server did not start")
	}
	return r
}

// stop cancels the installer (SIGTERM in Main) and returns Run's result.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err // for the cleanup
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("installer did not stop within 10s")
		return nil
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// ready returns the /ready status code and body.
func (r *running) ready(t *testing.T) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + r.admin + "/ready")
	if err != nil {
		t.Fatalf("GET /ready: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (r *running) waitReady(t *testing.T) {
	t.Helper()
	waitFor(t, 5*time.Second, "/ready to answer 200", func() (bool, string) {
		code, body := r.ready(t)
		return code == http.StatusOK, fmt.Sprintf("%d %s", code, body)
	})
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	began := time.Now()
	var last string
	for time.Since(began) < timeout {
		ok, state := cond()
		if ok {
			return time.Since(began)
		}
		last = state
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out after %v waiting for %s; last state: %s", timeout, what, last)
	return 0
}

// lastPlugin parses a list with libcni, as a runtime would, and returns its
// plugin types and the decoded last plugin.
func lastPlugin(t *testing.T, data string) ([]string, map[string]any) {
	t.Helper()
	list, err := libcni.ConfListFromBytes([]byte(data))
	if err != nil {
		t.Fatalf("libcni cannot load the config: %v\n%s", err, data)
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Network.Type)
	}
	var last map[string]any
	if err := json.Unmarshal(list.Plugins[len(list.Plugins)-1].Bytes, &last); err != nil {
		t.Fatal(err)
	}
	return types, last
}

func hasLinkerdLast(data string) bool {
	list, err := libcni.ConfListFromBytes([]byte(data))
	if err != nil || len(list.Plugins) == 0 {
		return false
	}
	n := 0
	for _, p := range list.Plugins {
		if p.Network.Type == "linkerd-cni" {
			n++
		}
	}
	return n == 1 && list.Plugins[len(list.Plugins)-1].Network.Type == "linkerd-cni"
}

// dirNames lists a directory, to check that nothing was left behind.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func contextWithTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

// slogFor logs into the test log.
func slogFor(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}
