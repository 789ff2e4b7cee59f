package kubetest

import (
	"context"
	"errors"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/test/netnstest"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// freshNetNS creates a network namespace for the test and removes it on
// cleanup. It skips the test when not root, since only root can.
func freshNetNS(t *testing.T) string {
	t.Helper()
	return netnstest.NewNetNS(t).Path()
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: starts etcd and kube-apiserver (run `make kube-bins` first)")
	}
	tests := []struct {
		name  string
		netns func(t *testing.T) string
	}{
		{name: "loopback in the current netns", netns: func(*testing.T) string { return "" }},
		{name: "inside a fresh netns", netns: freshNetNS},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := tt.netns(t)
			began := time.Now()
			c := Start(t, Options{NetNSPath: path})
			t.Logf("start-up took %v", time.Since(began).Round(time.Millisecond))
			exerciseCluster(t, c)

			if path != "" {
				// The server listens on the namespace's own loopback: the
				// same address must be unreachable from this namespace.
				hostport := strings.TrimPrefix(c.Host, "https://")
				conn, err := net.DialTimeout("tcp", hostport, time.Second)
				if err == nil {
					conn.Close()
					t.Errorf("dialled %s from the test's own netns: the API server leaked out of %s", hostport, path)
				}
			}

			pids := make([]int, 0, len(c.procs))
			for _, p := range c.procs {
				pids = append(pids, p.cmd.Process.Pid)
			}
			c.Stop()
			for _, pid := range pids {
				// Stop waited for the children, so the PID is reaped and gone.
				if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
					t.Errorf("process %d still exists after Stop (kill 0: %v)", pid, err)
				}
			}
		})
	}
}

// exerciseCluster drives the API the way the CNI plugin tests will: objects
// created as admin, a service-account token with RBAC enforced, a kubeconfig
// in the installer's shape, and counting that account's requests in the
// audit log.
func exerciseCluster(t *testing.T, c *Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ns, sa, podName = "kubetest", "cni", "meshed"

	admin := c.Clientset
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: ns},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{
		ObjectMeta: metav1.ObjectMeta{Name: sa},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create service account: %v", err)
	}
	if _, err := admin.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: podName},
		Spec: corev1.PodSpec{
			NodeName: "node1",
			Containers: []corev1.Container{
				{Name: "app", Image: "example.invalid/app"},
				{Name: "linkerd-proxy", Image: "example.invalid/proxy"},
			},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}

	token, err := c.TokenFor(ctx, ns, sa)
	if err != nil {
		t.Fatalf("TokenFor: %v", err)
	}
	saClient, err := kubernetes.NewForConfig(c.ConfigForToken(token))
	if err != nil {
		t.Fatalf("service-account clientset: %v", err)
	}

	// With no binding, RBAC denies everything to the account.
	if _, err := saClient.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("service account listing secrets: got %v, want Forbidden", err)
	}
	if _, err := saClient.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("service account getting a pod before any binding: got %v, want Forbidden", err)
	}

	// Grant exactly "get pods" and check RBAC lets that through, and only that.
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		Rules:      []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get"}}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create role: %v", err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "pod-reader"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "pod-reader"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: sa}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create role binding: %v", err)
	}
	// The RBAC authorizer reads bindings from an informer: wait until the
	// grant is visible, counting the attempts for the audit check below.
	getAttempts := 1 // the Forbidden get above
	deadline := time.Now().Add(30 * time.Second)
	for {
		getAttempts++
		pod, err := saClient.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{})
		if err == nil {
			if pod.Spec.NodeName != "node1" {
				t.Fatalf("pod read back with nodeName %q, want node1", pod.Spec.NodeName)
			}
			break
		}
		if !apierrors.IsForbidden(err) || time.Now().After(deadline) {
			t.Fatalf("service account getting a pod after the binding: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := saClient.CoreV1().Secrets(ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("service account listing secrets after a pods-only grant: got %v, want Forbidden", err)
	}

	// The kubeconfig in the installer's shape works as written.
	kcPath := t.TempDir() + "/ZZZ-linkerd-cni-kubeconfig"
	if err := c.WriteKubeconfig(kcPath, token); err != nil {
		t.Fatalf("WriteKubeconfig: %v", err)
	}
	if fi, err := os.Stat(kcPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("kubeconfig mode: %v %v, want 0600", fi.Mode().Perm(), err)
	}
	raw, err := clientcmd.LoadFromFile(kcPath)
	if err != nil {
		t.Fatalf("load kubeconfig: %v", err)
	}
	kctx, ok := raw.Contexts[raw.CurrentContext]
	if raw.CurrentContext != "linkerd-cni-context" || !ok || kctx.Cluster != "local" || kctx.AuthInfo != "linkerd-cni" {
		t.Fatalf("kubeconfig current context %q = %+v, want linkerd-cni-context -> cluster local, user linkerd-cni",
			raw.CurrentContext, kctx)
	}
	kcCfg, err := clientcmd.BuildConfigFromFlags("", kcPath)
	if err != nil {
		t.Fatalf("rest config from kubeconfig: %v", err)
	}
	kcCfg.Dial = c.AdminConfig().Dial // reach into the cluster's netns, if any
	kcClient, err := kubernetes.NewForConfig(kcCfg)
	if err != nil {
		t.Fatalf("clientset from kubeconfig: %v", err)
	}
	if _, err := kcClient.CoreV1().Pods(ns).Get(ctx, podName, metav1.GetOptions{}); err != nil {
		t.Fatalf("get pod with the kubeconfig: %v", err)
	}

	// Audit: exactly the account's requests, each once, with their outcome.
	user := ServiceAccountUser(ns, sa)
	wantTotal := 1 /* list secrets */ + getAttempts + 1 /* list secrets */ + 1 /* kubeconfig get */
	count := func(evs []AuditEvent, verb, resource string, code int) int {
		n := 0
		for _, e := range evs {
			if e.Verb == verb && e.Resource() == resource && e.Code() == code {
				n++
			}
		}
		return n
	}
	wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
	defer wcancel()
	evs, err := c.WaitAuditEvents(wctx, user, func(evs []AuditEvent) bool { return len(evs) >= wantTotal })
	if err != nil {
		t.Fatalf("audit events of %s: got %d, want %d: %v", user, len(evs), wantTotal, err)
	}
	// Let any stray event land before asserting the exact count.
	time.Sleep(200 * time.Millisecond)
	if evs, err = c.AuditEvents(user); err != nil {
		t.Fatalf("AuditEvents: %v", err)
	}
	checks := []struct {
		what           string
		verb, resource string
		code, want     int
	}{
		{"denied secret lists", "list", "secrets", 403, 2},
		{"successful pod gets", "get", "pods", 200, 2},
		{"denied pod gets", "get", "pods", 403, getAttempts - 1},
	}
	for _, ck := range checks {
		if got := count(evs, ck.verb, ck.resource, ck.code); got != ck.want {
			t.Errorf("audit: %d %s by %s, want %d", got, ck.what, user, ck.want)
		}
	}
	if len(evs) != wantTotal {
		t.Errorf("audit: %d events by %s, want %d", len(evs), user, wantTotal)
	}
	if all, err := c.AuditEvents(""); err != nil || len(all) <= len(evs) {
		t.Errorf("audit: %d events in all (err %v), want more than the account's %d", len(all), err, len(evs))
	}
	if admins, err := c.AuditEvents(AdminUser); err != nil || count(admins, "create", "pods", 201) != 1 {
		t.Errorf("audit: admin pod creations = %d (err %v), want 1", count(admins, "create", "pods", 201), err)
	}
}

// TestStopStartAPIServer: StopAPIServer leaves the API unreachable and etcd running;
// StartAPIServer brings the API server back with the state it had; Stop then stops both.
func TestStopStartAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: starts etcd and kube-apiserver (run `make kube-bins` first)")
	}
	c := Start(t, Options{NetNSPath: freshNetNS(t)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kept"}}
	if _, err := c.Clientset.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	if err := c.StopAPIServer(); err == nil {
		t.Error("StopAPIServer twice: no error")
	}
	rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
	_, err := c.Clientset.CoreV1().Namespaces().Get(rctx, "kept", metav1.GetOptions{})
	rcancel()
	if err == nil {
		t.Fatal("the API answered with kube-apiserver stopped")
	}
	if err := c.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	if err := c.StartAPIServer(ctx); err == nil {
		t.Error("StartAPIServer while it runs: no error")
	}
	if _, err := c.Clientset.CoreV1().Namespaces().Get(ctx, "kept", metav1.GetOptions{}); err != nil {
		t.Errorf("after StartAPIServer: %v; want the namespace created before the stop", err)
	}
	pids := make([]int, 0, len(c.procs))
	for _, p := range c.procs {
		pids = append(pids, p.cmd.Process.Pid)
	}
	if len(pids) != 2 {
		t.Errorf("%d processes after the restart, want etcd and kube-apiserver", len(pids))
	}
	c.Stop()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("process %d still exists after Stop (kill 0: %v)", pid, err)
		}
	}
}
