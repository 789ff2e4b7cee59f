package agent

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
)

// runtimeHealth is a SandboxFinder whose Healthy answers what the test sets.
type runtimeHealth struct {
	mu  sync.Mutex
	err error
}

func (h *runtimeHealth) Find(context.Context, string) (Sandbox, error) {
	return Sandbox{}, ErrNoSandbox
}
func (h *runtimeHealth) Forget(string, string) {}

func (h *runtimeHealth) Healthy() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.err
}

func (h *runtimeHealth) set(err error) {
	h.mu.Lock()
	h.err = err
	h.mu.Unlock()
}

// The kubelet probes /live every few seconds: while the runtime stays unreachable the agent says
// so once, and once more when it answers again, whatever the number of probes.
func TestLiveLogsChangesOnly(t *testing.T) {
	client, err := kubeclient.New(&rest.Config{Host: "https://127.0.0.1:1"}) // never dialled
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	health := &runtimeHealth{}
	a, err := New(client, Options{NodeName: "node-1", Sandboxes: health, Log: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	a.running.Store(true)
	h := a.Handler()
	down := errors.New("the CRI at unix:///run/containerd/containerd.sock has refused every call since 2026-01-02T03:04:05Z")
	for _, step := range []struct {
		name   string
		err    error
		probes int
		code   int
		lines  []string // the log lines so far, by message
	}{
		{"live", nil, 3, http.StatusOK, nil},
		{"the runtime refuses", down, 5, http.StatusServiceUnavailable, []string{"not live: restart me to reach the runtime again"}},
		{"it answers again", nil, 4, http.StatusOK, []string{"not live: restart me to reach the runtime again", "live again: the runtime answers"}},
		{"it refuses again", down, 2, http.StatusServiceUnavailable, []string{"not live: restart me to reach the runtime again", "live again: the runtime answers",
			"not live: restart me to reach the runtime again"}},
	} {
		health.set(step.err)
		for range step.probes {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/live", nil))
			if rec.Code != step.code {
				t.Fatalf("%s: /live = %d %q, want %d", step.name, rec.Code, rec.Body.String(), step.code)
			}
			if step.err != nil && !strings.Contains(rec.Body.String(), step.err.Error()) {
				t.Errorf("%s: /live says %q, want the runtime's error", step.name, rec.Body.String())
			}
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
			if _, msg, ok := strings.Cut(l, `msg="`); ok {
				got = append(got, msg[:strings.IndexByte(msg, '"')])
			}
		}
		if strings.Join(got, "\n") != strings.Join(step.lines, "\n") {
			t.Errorf("after %s (%d probes), the log says %q, want %q:\n%s", step.name, step.probes, got, step.lines, log.String())
		}
	}
	if !strings.Contains(log.String(), `error="`+down.Error()+`"`) {
		t.Errorf("the not-live line does not name the runtime's error:\n%s", log.String())
	}
}
