// Package kubetest runs a real etcd and kube-apiserver as child processes for
// integration tests, optionally inside a network namespace the test owns.
//
// The binaries are built once by test/kube/build.sh into a cache outside the
// repository (see BinDir); Start never builds them unless KUBETEST_BUILD=1.
// Each Cluster gets its own throwaway CA, serving certificate,
// service-account keys, admin token, etcd data and audit log under
// t.TempDir(), and is stopped by t.Cleanup.
//
// Limits: there is no controller-manager, scheduler or kubelet. Nothing
// creates "default" service accounts, schedules pods or runs them; pods stay
// Pending unless a test writes their status. The ServiceAccount admission
// plugin is disabled for that reason (it would reject every pod whose
// namespace lacks a "default" service account), unless a harness that starts
// those components itself (test/e2e) asks for it. The API server listens on
// 127.0.0.1 unless told otherwise, so it is reachable only from the namespace
// it runs in; the clients this package hands out dial from that namespace.
package kubetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// AdminUser is the user name of the admin token; it is in system:masters.
const AdminUser = "kubetest-admin"

// Options configures Start. The zero value runs on loopback in the current
// network namespace.
type Options struct {
	// NetNSPath, when set, runs etcd and kube-apiserver inside this existing
	// network namespace (for example /var/run/netns/node1). Its lo is
	// brought up. Entering it requires root.
	NetNSPath string
	// BinDir overrides where kube-apiserver and etcd are taken from. When
	// set, the binaries are used as they are, with no staleness check.
	BinDir string
	// StartTimeout bounds the wait for etcd and for /readyz. Default 90s.
	StartTimeout time.Duration
	// ExtraAPIServerArgs are appended to the kube-apiserver command line.
	ExtraAPIServerArgs []string
	// BindAddress is where kube-apiserver listens; default 127.0.0.1. Clients
	// this package hands out still dial 127.0.0.1.
	BindAddress string
	// SecurePort is kube-apiserver's port; 0 picks a free one. A cluster whose
	// pods reach the API through the "kubernetes" Service's IP without a
	// kube-proxy serves on that Service's port, 443.
	SecurePort int
	// ServingIPs are further addresses the serving certificate is valid for,
	// such as a node's address or the "kubernetes" Service's IP.
	ServingIPs []net.IP
	// ServiceAccountAdmission keeps the ServiceAccount admission plugin on, so
	// pods get their service account token mounted. Only for a cluster with a
	// kube-controller-manager: the plugin rejects pods in a namespace that has
	// no "default" service account yet.
	ServiceAccountAdmission bool
}

// Cluster is a running etcd and kube-apiserver pair.
type Cluster struct {
	// Host is the API server URL, https://127.0.0.1:<port>.
	Host string
	// CAFile is the PEM file of the CA that signed the serving certificate.
	CAFile string
	// CAData is the content of CAFile.
	CAData []byte
	// Clientset is an admin (system:masters) client.
	Clientset kubernetes.Interface
	// NetNSPath is Options.NetNSPath.
	NetNSPath string
	// Dir holds the certificates, etcd data, logs and audit log.
	Dir string
	// AuditLogPath is the kube-apiserver audit log (JSON lines).
	AuditLogPath string
	// APIServerLogPath and EtcdLogPath hold the processes' stdout and stderr.
	APIServerLogPath, EtcdLogPath string
	// EtcdURL is etcd's client URL.
	EtcdURL string

	adminToken string
	launcher   *launcher
	procs      []*proc // in start order
	// apiBin and apiArgs start kube-apiserver again after StopAPIServer.
	apiBin  string
	apiArgs []string
	// mu guards procs against StopAPIServer and StartAPIServer racing Stop.
	mu       sync.Mutex
	stopOnce sync.Once
	// tailsReported is set when a start error already carried the logs.
	tailsReported bool
}

// proc is one child process and its log.
type proc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	log     *os.File
	exited  chan struct{} // closed when Wait returns
	waitErr error
}

// Start starts etcd and kube-apiserver, waits until the API server is ready
// and registers their shutdown with t.Cleanup. It fails the test (t.Fatal)
// on any error, including binaries missing from the cache.
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	c, err := start(t, opts)
	if err != nil {
		t.Fatalf("kubetest: start cluster: %v", err)
	}
	return c
}

func start(t testing.TB, opts Options) (_ *Cluster, retErr error) {
	binDir := opts.BinDir
	if binDir == "" {
		binDir = BinDir()
	}
	if err := ensureBinaries(binDir, opts.BinDir != "", t.Logf); err != nil {
		return nil, err
	}
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = 90 * time.Second
	}
	began := time.Now()

	dir := t.TempDir()
	p, err := writePKI(dir, opts.ServingIPs)
	if err != nil {
		return nil, err
	}
	adminToken, err := randomToken()
	if err != nil {
		return nil, err
	}
	// Columns: token, user, uid, "group1,group2".
	tokens := fmt.Sprintf("%s,%s,%s,\"system:masters\"\n", adminToken, AdminUser, AdminUser)
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(tokens), 0o600); err != nil {
		return nil, fmt.Errorf("write token file: %w", err)
	}
	policyFile := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policyFile, []byte(auditPolicy), 0o644); err != nil {
		return nil, fmt.Errorf("write audit policy: %w", err)
	}

	l, err := newLauncher(opts.NetNSPath)
	if err != nil {
		return nil, err
	}
	c := &Cluster{
		CAFile:           p.caPath,
		CAData:           p.caData,
		NetNSPath:        opts.NetNSPath,
		Dir:              dir,
		AuditLogPath:     filepath.Join(dir, "audit.log"),
		APIServerLogPath: filepath.Join(dir, "kube-apiserver.log"),
		EtcdLogPath:      filepath.Join(dir, "etcd.log"),
		adminToken:       adminToken,
		launcher:         l,
	}
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() && !c.tailsReported {
			c.logTails(t)
		}
	})
	defer func() {
		if retErr != nil {
			c.Stop()
			retErr = fmt.Errorf("%w\n%s", retErr, c.tails())
			c.tailsReported = true
		}
	}()

	ports, err := l.freePorts(3)
	if err != nil {
		return c, err
	}
	etcdPort, peerPort, apiPort := ports[0], ports[1], ports[2]
	if opts.SecurePort != 0 {
		apiPort = opts.SecurePort
	}
	bind := opts.BindAddress
	if bind == "" {
		bind = "127.0.0.1"
	}
	c.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(etcdPort)
	c.Host = "https://127.0.0.1:" + strconv.Itoa(apiPort)

	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()

	etcd, err := c.startProc("etcd", filepath.Join(binDir, "etcd"), c.EtcdLogPath,
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-url", c.EtcdURL,
		"--listen-peer-url", "http://127.0.0.1:"+strconv.Itoa(peerPort),
	)
	if err != nil {
		return c, err
	}
	if err := c.waitEtcd(ctx, etcd); err != nil {
		return c, err
	}

	args := []string{
		"--etcd-servers", c.EtcdURL,
		"--bind-address", bind,
		// Without it the server looks for a default route, which a test
		// namespace lacks. Nothing is sent to it: no endpoints are reconciled.
		"--advertise-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(apiPort),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--tls-cert-file", p.servingCert,
		"--tls-private-key-file", p.servingKey,
		"--token-auth-file", tokenFile,
		"--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file", p.saPublicKey,
		"--service-account-signing-key-file", p.saSigningKey,
		"--authorization-mode", "Node,RBAC",
		"--endpoint-reconciler-type", "none",
		"--enable-priority-and-fairness=false",
		"--allow-privileged=true",
		"--service-cluster-ip-range", "10.96.0.0/12",
		"--audit-log-path", c.AuditLogPath,
		"--audit-policy-file", policyFile,
		"--audit-log-format", "json",
		"--audit-log-mode", "blocking",
		"--profiling=false",
	}
	if !opts.ServiceAccountAdmission {
		args = append(args, "--disable-admission-plugins", "ServiceAccount")
	}
	args = append(args, opts.ExtraAPIServerArgs...)
	c.apiBin, c.apiArgs = filepath.Join(binDir, "kube-apiserver"), args
	api, err := c.startProc("kube-apiserver", c.apiBin, c.APIServerLogPath, args...)
	if err != nil {
		return c, err
	}

	cs, err := kubernetes.NewForConfig(c.AdminConfig())
	if err != nil {
		return c, fmt.Errorf("admin clientset: %w", err)
	}
	c.Clientset = cs
	if err := c.waitReady(ctx, api); err != nil {
		return c, err
	}
	t.Logf("kubetest: kube-apiserver %s ready in %v (netns %q, dir %s)",
		c.Host, time.Since(began).Round(time.Millisecond), opts.NetNSPath, dir)
	return c, nil
}

func randomToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return hex.EncodeToString(b), nil
}

// startProc forks bin on the launcher's thread, so the child lands in the
// cluster's network namespace.
func (c *Cluster) startProc(name, bin, logPath string, args ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// SIGKILL the child if the test binary dies without running Stop.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr := &proc{name: name, cmd: cmd, logPath: logPath, log: logf, exited: make(chan struct{})}
	var startErr error
	if err := c.launcher.do(func() { startErr = cmd.Start() }); err != nil {
		startErr = err
	}
	if startErr != nil {
		logf.Close()
		return nil, fmt.Errorf("start %s: %w", name, startErr)
	}
	c.mu.Lock()
	c.procs = append(c.procs, pr)
	c.mu.Unlock()
	go func() {
		pr.waitErr = cmd.Wait()
		close(pr.exited)
	}()
	return pr, nil
}

// waitEtcd polls etcd's /health from inside the namespace.
func (c *Cluster) waitEtcd(ctx context.Context, etcd *proc) error {
	hc := &http.Client{
		Transport: &http.Transport{DialContext: c.launcher.dial},
		Timeout:   2 * time.Second,
	}
	defer hc.CloseIdleConnections()
	var last error
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.EtcdURL+"/health", nil)
		if err != nil {
			return fmt.Errorf("etcd health request: %w", err)
		}
		resp, err := hc.Do(req)
		if err == nil {
			var body bytes.Buffer
			_, _ = body.ReadFrom(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK && bytes.Contains(body.Bytes(), []byte(`"health":"true"`)) {
				return nil
			}
			last = fmt.Errorf("status %d: %s", resp.StatusCode, bytes.TrimSpace(body.Bytes()))
		} else {
			last = err
		}
		select {
		case <-etcd.exited:
			return fmt.Errorf("etcd exited before it was healthy: %v", etcd.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("etcd not healthy at %s: %w (last: %v)", c.EtcdURL, ctx.Err(), last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// waitReady polls /readyz with the admin client.
func (c *Cluster) waitReady(ctx context.Context, api *proc) error {
	var last error
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		body, err := c.Clientset.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		cancel()
		if err == nil && string(body) == "ok" {
			return nil
		}
		if err != nil {
			last = err
		} else {
			last = fmt.Errorf("/readyz answered %q", body)
		}
		select {
		case <-api.exited:
			return fmt.Errorf("kube-apiserver exited before it was ready: %v", api.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("kube-apiserver not ready at %s: %w (last: %v)", c.Host, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// StopAPIServer stops kube-apiserver alone (SIGTERM, SIGKILL after 10s) and waits for it, so
// that a test sees the API server down while etcd keeps the cluster's state. StartAPIServer
// brings it back.
func (c *Cluster) StopAPIServer() error {
	c.mu.Lock()
	var api *proc
	for i, pr := range c.procs {
		if pr.name == "kube-apiserver" {
			api = pr
			c.procs = append(c.procs[:i:i], c.procs[i+1:]...)
			break
		}
	}
	c.mu.Unlock()
	if api == nil {
		return errors.New("kube-apiserver is not running")
	}
	stopProc(api)
	return nil
}

// StartAPIServer starts kube-apiserver again, with the flags it first had, after StopAPIServer,
// and waits until it is ready.
func (c *Cluster) StartAPIServer(ctx context.Context) error {
	c.mu.Lock()
	for _, pr := range c.procs {
		if pr.name == "kube-apiserver" {
			c.mu.Unlock()
			return errors.New("kube-apiserver is running already")
		}
	}
	c.mu.Unlock()
	api, err := c.startProc("kube-apiserver", c.apiBin, c.APIServerLogPath, c.apiArgs...)
	if err != nil {
		return err
	}
	return c.waitReady(ctx, api)
}

// stopProc terminates pr (SIGTERM, SIGKILL after 10s) and waits for it.
func stopProc(pr *proc) {
	_ = pr.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-pr.exited:
	case <-time.After(10 * time.Second):
		_ = pr.cmd.Process.Kill()
		<-pr.exited
	}
	pr.log.Close()
}

// Stop terminates kube-apiserver and then etcd (SIGTERM, SIGKILL after 10s),
// waits for them and releases the launcher thread. It is idempotent and is
// registered with t.Cleanup by Start.
func (c *Cluster) Stop() {
	c.stopOnce.Do(func() {
		c.mu.Lock()
		procs := c.procs
		c.mu.Unlock()
		for i := len(procs) - 1; i >= 0; i-- {
			stopProc(procs[i])
		}
		c.launcher.close()
	})
}

// AdminConfig returns a new rest.Config for the admin user. When the cluster
// runs in a network namespace, its Dial connects from inside it.
func (c *Cluster) AdminConfig() *rest.Config {
	return c.ConfigForToken(c.adminToken)
}

// ConfigForToken returns a rest.Config that authenticates with a bearer
// token, e.g. one from TokenFor, and dials like AdminConfig.
func (c *Cluster) ConfigForToken(token string) *rest.Config {
	cfg := &rest.Config{
		Host:            c.Host,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: c.CAData},
		// Tests make bursts of calls; client-side throttling only slows them.
		QPS:   200,
		Burst: 400,
	}
	if c.NetNSPath != "" {
		cfg.Dial = c.launcher.dial
	}
	return cfg
}

// TokenFor mints a token for a service account with the TokenRequest API
// (default lifetime, audience the API server itself). The service account
// must exist.
func (c *Cluster) TokenFor(ctx context.Context, namespace, serviceAccount string) (string, error) {
	tr, err := c.Clientset.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, serviceAccount,
		&authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token request for %s/%s: %w", namespace, serviceAccount, err)
	}
	if tr.Status.Token == "" {
		return "", fmt.Errorf("token request for %s/%s: empty token", namespace, serviceAccount)
	}
	return tr.Status.Token, nil
}

// AuditEvents returns the audit events of user so far ("" for everyone), one
// per completed request (see ServiceAccountUser for service accounts). The
// server logs an event just after answering, so use WaitAuditEvents to wait
// for requests that have just returned.
func (c *Cluster) AuditEvents(user string) ([]AuditEvent, error) {
	return readAuditLog(c.AuditLogPath, user)
}

// WaitAuditEvents polls the audit log until match accepts the events of
// user, and returns them; on timeout it returns the last events read and an
// error.
func (c *Cluster) WaitAuditEvents(ctx context.Context, user string, match func([]AuditEvent) bool) ([]AuditEvent, error) {
	for {
		evs, err := c.AuditEvents(user)
		if err != nil {
			return nil, err
		}
		if match(evs) {
			return evs, nil
		}
		select {
		case <-ctx.Done():
			return evs, fmt.Errorf("wait for audit events of %q: %w", user, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// logTails writes the end of each process log into the test log.
func (c *Cluster) logTails(t testing.TB) {
	t.Helper()
	t.Log(c.tails())
}

func (c *Cluster) tails() string {
	var b bytes.Buffer
	// The API server first: it is the usual suspect.
	for i := len(c.procs) - 1; i >= 0; i-- {
		pr := c.procs[i]
		fmt.Fprintf(&b, "--- last lines of %s (%s) ---\n%s\n", pr.name, pr.logPath, tail(pr.logPath, 40))
	}
	return b.String()
}

// tail returns the last n lines of a file, or a note saying why it cannot.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "(no log)"
		}
		return fmt.Sprintf("(read log: %v)", err)
	}
	data = bytes.TrimRight(data, "\n")
	lines := bytes.Split(data, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
