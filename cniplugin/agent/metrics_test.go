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
	"github.com/kubemesh/proxy-init/cniplugin/wire"
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

// TestCallExemplars: a reported call's trace ID becomes its duration's exemplar when it is a W3C
// trace ID; anything else the report claims is not one, and the duration is counted without it.
func TestCallExemplars(t *testing.T) {
	for _, tc := range []struct{ traceID, want string }{
		{"4bf92f3577b34da6a3ce929d0e0e4736", "4bf92f3577b34da6a3ce929d0e0e4736"},
		{"", ""},
		{`4bf92f3577b34da6a3ce929d0e0e4736"} 1`, ""},
		{"00000000000000000000000000000000", ""},
	} {
		m := newMetrics(MetricsPrefix, func() float64 { return 0 }, false)
		m.plugin(wire.Report{Command: wire.CommandAdd, Result: "ok", Lookup: "agent", Seconds: 0.003, TraceID: tc.traceID})
		fams, err := m.registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var count uint64
		var got []string
		for _, f := range fams {
			if f.GetName() != MetricsPrefix+"plugin_call_duration_seconds" {
				continue
			}
			for _, s := range f.GetMetric() {
				count += s.GetHistogram().GetSampleCount()
				for _, b := range s.GetHistogram().GetBucket() {
					for _, l := range b.GetExemplar().GetLabel() {
						got = append(got, l.GetName()+"="+l.GetValue())
					}
				}
			}
		}
		want := []string(nil)
		if tc.want != "" {
			want = []string{"trace_id=" + tc.want}
		}
		if count != 1 || strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("trace ID %q: %d samples, exemplars %q; want 1 and %q", tc.traceID, count, got, want)
		}
	}
}
