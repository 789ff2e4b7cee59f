package repair_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/cniplugin/repair"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/test/cnitest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// `linkerd-cni repair` is run as a child process (this test binary, re-executed) inside the
// cluster's network namespace, where the API server listens.
func TestMain(m *testing.M) {
	nt.ChildMain(func() int {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
		defer stop()
		return repair.Main(ctx, os.Args[1:], io.Discard, os.Stderr)
	})
	os.Exit(m.Run())
}

// TestMainEndToEnd runs the real command: KUBECONFIG in the installer's shape with the
// ServiceAccount's token, the admin endpoints over TCP, a repair, and a clean SIGTERM shutdown.
func TestMainEndToEnd(t *testing.T) {
	c := startCluster(t)
	admin := c.Clientset
	ctx := ctxFor(t, 2*time.Minute)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: appNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rules, _ := deployClusterRole(t)
	_, token := serviceAccount(t, c, cniSA, "linkerd-cni", rules)
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}
	p := &podSpec{name: "failed", node: nodeA, meshed: true, state: terminated(95, "m1")}
	createPod(t, admin, p)

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	const adminAddr = "127.0.0.1:9990"
	cmd := exec.Command(self, "--admin-addr", adminAddr, "--log-format", "json")
	cmd.Env = append(os.Environ(), nt.ChildEnv(t, c.NetNSPath), "KUBECONFIG="+kubeconfig, repair.EnvNodeName+"="+nodeA)
	var stderr cnitest.SyncBuffer
	cmd.Stderr = &stderr
	if err := netnsutil.Do(c.NetNSPath, cmd.Start); err != nil {
		t.Fatal(err)
	}
	// exited is closed when the child has been reaped; waitErr is then its status.
	exited := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("repair controller log:\n%s", stderr.String())
		}
	})

	// An HTTP client whose connections are opened inside the cluster's namespace.
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := netnsutil.Do(c.NetNSPath, func() error {
				var err error
				conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
	fetch := func(path string) (int, string) {
		resp, err := client.Get("http://" + adminAddr + path)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	waitFor(t, "/ready", func() bool { code, _ := fetch("/ready"); return code == http.StatusOK })
	if code, body := fetch("/live"); code != http.StatusOK {
		t.Errorf("/live = %d %s", code, body)
	}
	waitFor(t, "the failed pod to be deleted", func() bool {
		_, err := admin.CoreV1().Pods(appNS).Get(ctx, p.name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	_, body := fetch("/metrics")
	if m := regexp.MustCompile(`(?m)^` + agent.RepairMetricsPrefix + `deleted_total (\S+)$`).FindStringSubmatch(body); m == nil || m[1] != "1" {
		t.Errorf("/metrics deleted_total = %v, want 1:\n%s", m, body)
	}
	if !strings.Contains(body, "process_cpu_seconds_total") {
		t.Errorf("/metrics lacks the process collector")
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Errorf("after SIGTERM: %v, want exit 0", waitErr)
		}
	case <-time.After(waitLong):
		t.Fatal("no exit after SIGTERM")
	}
	log := stderr.String()
	for _, want := range []string{`"msg":"deleted pod whose network validator failed`, `"pod":"app/failed"`, `"msg":"repair controller stopped"`} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %s", want)
		}
	}
}
