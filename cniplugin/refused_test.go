package cniplugin

import (
	"bytes"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubemesh/proxy-init/internal/kubeconfig"
)

// TestStatusAfterRefusedCredentials: an ADD the API server refuses (401, then 403) records when
// the refusals began, and STATUS passes until they have lasted longer than
// kubernetes.status-unauthorized-after, then fails with error 50 and a message naming
// linkerd-cni; later refusals do not move the start, a kubeconfig written since makes them void
// (and the next refusal starts the clock again), other API failures neither record nor clear it,
// and the first ADD that succeeds clears it, so STATUS passes again.
func TestStatusAfterRefusedCredentials(t *testing.T) {
	var answer atomic.Int32 // the HTTP status the pod lookups get
	answer.Store(http.StatusUnauthorized)
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch code := int(answer.Load()); code {
		case http.StatusOK:
			// An unmeshed pod: its ADD needs no namespace and writes nothing.
			_, _ = w.Write([]byte(`{"metadata":{"name":"api-0","namespace":"web"},"spec":{"containers":[{"name":"app"}]}}`))
		default:
			w.WriteHeader(code)
			_, _ = w.Write([]byte(fmt.Sprintf(`{"kind":"Status","status":"Failure","code":%d}`, code)))
		}
	}))
	defer srv.Close()
	dir := t.TempDir()
	kc := filepath.Join(dir, "ZZZ-linkerd-cni-kubeconfig")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(kc, kubeconfig.Render(kubeconfig.Params{Server: srv.URL, Token: "dead", CA: ca}), 0o600); err != nil {
		t.Fatal(err)
	}
	// Written by an installer an hour ago, before any refusal.
	if err := os.Chtimes(kc, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	stateDir := filepath.Join(dir, "state")
	conf := strings.Replace(linkerdChartConfig, `"kubeconfig":"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"`,
		`"kubeconfig":"`+kc+`","status-unauthorized-after":"2m","timeout":"2s"`, 1)
	conf = strings.Replace(conf, `"log_level":"info",`, `"log_level":"info","agent":{"socket":""},"state-dir":"`+stateDir+`",`, 1)
	marker := filepath.Join(stateDir, RefusedFile)
	p := NewNodePlugin()
	var logs bytes.Buffer
	p.Stdout, p.Stderr = &bytes.Buffer{}, &logs
	add := func() error {
		return p.Add(&skel.CmdArgs{ContainerID: "c1", IfName: "eth0", Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0",
			StdinData: withVersion(t, conf, "1.1.0")})
	}
	status := func() error { return p.Status(&skel.CmdArgs{StdinData: withVersion(t, conf, "1.1.0")}) }
	age := func(d time.Duration) { // the refusals began d ago
		t.Helper()
		if err := os.Chtimes(marker, time.Now().Add(-d), time.Now().Add(-d)); err != nil {
			t.Fatal(err)
		}
	}
	mtime := func() time.Time {
		t.Helper()
		fi, err := os.Stat(marker)
		if err != nil {
			t.Fatalf("no marker after a refused ADD: %v", err)
		}
		return fi.ModTime()
	}

	if code, _ := cniCode(t, add()); code != types.ErrTryAgainLater {
		t.Fatalf("refused ADD: code %d, want %d", code, types.ErrTryAgainLater)
	}
	if fi, err := os.Stat(marker); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("marker after a 401: %v, %v", fi, err)
	}
	if err := status(); err != nil {
		t.Errorf("STATUS just after the first refusal: %v, want success", err)
	}
	age(time.Minute)
	if err := status(); err != nil {
		t.Errorf("STATUS one minute into the refusals (bound 2m): %v, want success", err)
	}
	// A 403 later does not restart the clock.
	answer.Store(http.StatusForbidden)
	before := mtime()
	_ = add()
	if !mtime().Equal(before) {
		t.Errorf("a later refusal moved the start from %v to %v", before, mtime())
	}
	age(3 * time.Minute)
	code, msg := cniCode(t, status())
	if code != types.ErrPluginNotAvailable || !strings.HasPrefix(msg, "linkerd-cni: the Kubernetes API has refused the plugin's credentials (kubeconfig "+kc+") since ") ||
		!strings.Contains(msg, "more than 2m0s (kubernetes.status-unauthorized-after)") || !strings.Contains(msg, "linkerd-cni installer") {
		t.Errorf("STATUS three minutes into the refusals: code %d, %q; want %d naming linkerd-cni and the bound", code, msg, types.ErrPluginNotAvailable)
	}
	// The installer writes a fresh kubeconfig (a new pod, a rotated token): refusals of the old
	// one count no more, even with no ADD since to clear them.
	if err := os.Chtimes(kc, time.Now().Add(-time.Minute), time.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	if err := status(); err != nil {
		t.Errorf("STATUS after the kubeconfig was renewed: %v, want success", err)
	}
	// A refusal of the new kubeconfig starts the clock again.
	answer.Store(http.StatusUnauthorized)
	_ = add()
	if since := time.Since(mtime()); since > 30*time.Second {
		t.Errorf("the refusal of a renewed kubeconfig did not restart the clock: it began %v ago", since)
	}
	age(3 * time.Minute)
	if err := os.Chtimes(kc, time.Now().Add(-time.Hour), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if code, _ := cniCode(t, status()); code != types.ErrPluginNotAvailable {
		t.Errorf("STATUS three minutes into the new kubeconfig's refusals: code %d, want %d", code, types.ErrPluginNotAvailable)
	}
	// An API server that fails otherwise says nothing about the credentials.
	answer.Store(http.StatusServiceUnavailable)
	_ = add()
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("a 503 cleared the marker: %v", err)
	}
	answer.Store(http.StatusOK)
	if err := add(); err != nil {
		t.Fatalf("ADD once the credentials work: %v", err)
	}
	if _, err := os.Stat(marker); !os.IsNotExist(err) {
		t.Errorf("marker after a successful ADD: %v, want it gone", err)
	}
	if err := status(); err != nil {
		t.Errorf("STATUS after a successful ADD: %v", err)
	}
	if !strings.Contains(logs.String(), "the Kubernetes API accepts the plugin's credentials again") {
		t.Errorf("no log line for the recovery:\n%s", logs.String())
	}
}

// TestStatusUnauthorizedAfterConfig: the key's default, and its refusals.
func TestStatusUnauthorizedAfterConfig(t *testing.T) {
	conf, err := ParseConfig(withVersion(t, linkerdChartConfig, "1.1.0"))
	if err != nil {
		t.Fatal(err)
	}
	if got := conf.StatusUnauthorizedAfter(); got != 5*time.Minute {
		t.Errorf("default bound %v, want 5m", got)
	}
	for _, v := range []string{`"0s"`, `"-1m"`, `"soon"`, `300`} {
		bad := strings.Replace(linkerdChartConfig, `"kubernetes":{`, `"kubernetes":{"status-unauthorized-after":`+v+`,`, 1)
		if _, err := ParseConfig(withVersion(t, bad, "1.1.0")); err == nil || !strings.Contains(err.Error(), "kubernetes.status-unauthorized-after") {
			t.Errorf("status-unauthorized-after %s: %v, want an error naming the key", v, err)
		}
	}
}
