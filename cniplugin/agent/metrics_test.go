package agent

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
)

// TestInstallerReady: installer_ready follows the installer's /ready: 1 while it answers 200, 0
// once it answers otherwise.
func TestInstallerReady(t *testing.T) {
	var code atomic.Int32
	code.Store(http.StatusOK)
	installer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ready" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(int(code.Load()))
	}))
	defer installer.Close()
	client, err := kubeclient.New(&rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(client, Options{NodeName: "n", InstallerReadyURL: installer.URL + "/ready"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go a.watchInstaller(ctx, installer.URL+"/ready")
	gauge := func() string {
		rec := httptest.NewRecorder()
		a.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		for _, l := range strings.Split(rec.Body.String(), "\n") {
			if v, ok := strings.CutPrefix(l, MetricsPrefix+"installer_ready "); ok {
				return v
			}
		}
		return ""
	}
	for _, step := range []struct {
		code int32
		want string
	}{{http.StatusOK, "1"}, {http.StatusServiceUnavailable, "0"}} {
		code.Store(step.code)
		deadline := time.Now().Add(3 * installerPoll)
		for gauge() != step.want {
			if time.Now().After(deadline) {
				t.Fatalf("installer_ready = %q with /ready answering %d, want %s", gauge(), step.code, step.want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
