//go:build e2e

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
)

// loadObjects decodes every YAML document of files (relative to the repository's root).
func loadObjects(t testing.TB, files ...string) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	for _, f := range files {
		data, err := os.ReadFile(filepath.Join(repoRoot(t), f))
		if err != nil {
			t.Fatal(err)
		}
		objs = append(objs, decodeObjects(t, f, data)...)
	}
	return objs
}

// decodeObjects decodes every YAML document of data, from source (for messages).
func decodeObjects(t testing.TB, source string, data []byte) []runtime.Object {
	t.Helper()
	var objs []runtime.Object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		if len(bytes.TrimSpace(doc)) == 0 {
			continue
		}
		obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
		if err != nil {
			t.Fatalf("%s: %v", source, err)
		}
		objs = append(objs, obj)
	}
	return objs
}

// create creates each object; one that already exists is left as it is, except a ClusterRole or
// a Role, which is updated (the chart's renderings grant different rules).
func create(ctx context.Context, t testing.TB, cs kubernetes.Interface, objs ...runtime.Object) {
	t.Helper()
	for _, obj := range objs {
		var err error
		switch o := obj.(type) {
		case *corev1.Namespace:
			_, err = cs.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ServiceAccount:
			_, err = cs.CoreV1().ServiceAccounts(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.ConfigMap:
			_, err = cs.CoreV1().ConfigMaps(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *corev1.Pod:
			_, err = cs.CoreV1().Pods(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRole:
			_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.ClusterRoleBinding:
			_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.Role:
			_, err = cs.RbacV1().Roles(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *rbacv1.RoleBinding:
			_, err = cs.RbacV1().RoleBindings(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.DaemonSet:
			_, err = cs.AppsV1().DaemonSets(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *appsv1.Deployment:
			_, err = cs.AppsV1().Deployments(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *batchv1.Job:
			_, err = cs.BatchV1().Jobs(o.Namespace).Create(ctx, o, metav1.CreateOptions{})
		case *admissionv1.ValidatingAdmissionPolicy:
			_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionv1.ValidatingAdmissionPolicyBinding:
			_, err = cs.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		case *admissionv1.MutatingAdmissionPolicy:
			_, err = cs.AdmissionregistrationV1().MutatingAdmissionPolicies().Create(ctx, o, metav1.CreateOptions{})
		case *admissionv1.MutatingAdmissionPolicyBinding:
			_, err = cs.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Create(ctx, o, metav1.CreateOptions{})
		default:
			t.Fatalf("create: unexpected %T", obj)
		}
		if cr, ok := obj.(*rbacv1.ClusterRole); ok && apierrors.IsAlreadyExists(err) {
			var cur *rbacv1.ClusterRole
			if cur, err = cs.RbacV1().ClusterRoles().Get(ctx, cr.Name, metav1.GetOptions{}); err == nil {
				cr.ResourceVersion = cur.ResourceVersion
				_, err = cs.RbacV1().ClusterRoles().Update(ctx, cr, metav1.UpdateOptions{})
			}
		}
		if r, ok := obj.(*rbacv1.Role); ok && apierrors.IsAlreadyExists(err) {
			var cur *rbacv1.Role
			if cur, err = cs.RbacV1().Roles(r.Namespace).Get(ctx, r.Name, metav1.GetOptions{}); err == nil {
				r.ResourceVersion = cur.ResourceVersion
				_, err = cs.RbacV1().Roles(r.Namespace).Update(ctx, r, metav1.UpdateOptions{})
			}
		}
		if apierrors.IsAlreadyExists(err) {
			continue
		}
		if err != nil {
			t.Fatalf("create %T: %v", obj, err)
		}
	}
}

// waitFor polls cond every 200 ms until it returns true. After timeout it fails the test with
// desc, what is awaited, and cond's last error.
func waitFor(ctx context.Context, t testing.TB, timeout time.Duration, desc string, cond func(context.Context) (bool, error)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		ok, err := cond(ctx)
		if ok {
			return
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			t.Fatalf("waiting %v for %s: %v (last: %v)", timeout, desc, ctx.Err(), last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// podReady tells whether a pod's Ready condition is true.
func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// waitPods waits until the namespace holds exactly want pods matching selector, all Ready, and
// returns them.
func waitPods(ctx context.Context, t testing.TB, cs kubernetes.Interface, ns, selector string, want int, timeout time.Duration) []corev1.Pod {
	t.Helper()
	var pods []corev1.Pod
	waitFor(ctx, t, timeout, fmt.Sprintf("%d Ready pods %q in %s", want, selector, ns), func(ctx context.Context) (bool, error) {
		l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		pods = l.Items
		if len(pods) != want {
			return false, fmt.Errorf("%d pods", len(pods))
		}
		for i := range pods {
			if pods[i].DeletionTimestamp != nil || !podReady(&pods[i]) {
				return false, fmt.Errorf("pod %s not Ready: %s", pods[i].Name, describePod(&pods[i]))
			}
		}
		return true, nil
	})
	return pods
}

// describePod summarises a pod's phase and its containers' states, for failure messages.
func describePod(p *corev1.Pod) string {
	var b strings.Builder
	fmt.Fprintf(&b, "phase %s", p.Status.Phase)
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		switch {
		case cs.State.Running != nil:
			fmt.Fprintf(&b, "; %s running", cs.Name)
		case cs.State.Terminated != nil:
			fmt.Fprintf(&b, "; %s exited %d (%s)", cs.Name, cs.State.Terminated.ExitCode, cs.State.Terminated.Reason)
		case cs.State.Waiting != nil:
			fmt.Fprintf(&b, "; %s waiting (%s: %s)", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message)
		}
	}
	return b.String()
}

// waitGone waits until no pod matches selector in the namespace.
func waitGone(ctx context.Context, t testing.TB, cs kubernetes.Interface, ns, selector string, timeout time.Duration) {
	t.Helper()
	waitFor(ctx, t, timeout, fmt.Sprintf("pods %q in %s to be gone", selector, ns), func(ctx context.Context) (bool, error) {
		l, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return false, err
		}
		return len(l.Items) == 0, fmt.Errorf("%d pods left", len(l.Items))
	})
}

// pin makes a pod (or a template's pods) run on node n.
func pin(spec *corev1.PodSpec, n *Node) {
	spec.NodeSelector = map[string]string{"kubernetes.io/hostname": n.Name}
}

// containerID returns the containerd ID of a pod's container.
func containerID(t testing.TB, p *corev1.Pod, name string) string {
	t.Helper()
	for _, cs := range append(append([]corev1.ContainerStatus{}, p.Status.InitContainerStatuses...), p.Status.ContainerStatuses...) {
		if cs.Name == name && cs.ContainerID != "" {
			return strings.TrimPrefix(cs.ContainerID, "containerd://")
		}
	}
	t.Fatalf("pod %s/%s: no container %q with an ID (%s)", p.Namespace, p.Name, name, describePod(p))
	return ""
}

var execSeq atomic.Int64

// execIn runs args in a running container of a pod, as the container's own user, the way
// `kubectl exec` would, and returns its output.
func execIn(ctx context.Context, t testing.TB, c *Cluster, p *corev1.Pod, container string, args ...string) (string, error) {
	t.Helper()
	n := c.NodeOf(t, p)
	id := containerID(t, p, container)
	execID := fmt.Sprintf("e2e-%d-%d", os.Getpid(), execSeq.Add(1))
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return n.Run(ctx, append([]string{"ctr", "-n", "k8s.io", "tasks", "exec", "--exec-id", execID, id}, args...)...)
}

// podNetNS returns a path to a pod's network namespace, through the PID of one of its running
// containers.
func podNetNS(ctx context.Context, t testing.TB, c *Cluster, p *corev1.Pod, container string) string {
	t.Helper()
	n := c.NodeOf(t, p)
	id := containerID(t, p, container)
	out, err := n.Run(ctx, "ctr", "-n", "k8s.io", "tasks", "ls")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == id {
			return "/proc/" + f[1] + "/ns/net"
		}
	}
	t.Fatalf("no task for container %s of pod %s/%s in:\n%s", container, p.Namespace, p.Name, out)
	return ""
}

// ourRules returns the lines of every netfilter backend in a network namespace that belong to
// proxy-init or linkerd-cni: chains PROXY_INIT_* and the rules with our "proxy-init/..." comments
// (iptables-legacy, and iptables-nft both as iptables-nft-save and as nft shows them, which is
// without the comments of xtables matches), and the native table proxy_init.
func ourRules(ctx context.Context, t testing.TB, netns string) []string {
	t.Helper()
	var lines []string
	for _, cmd := range [][]string{
		{"nft", "list", "ruleset"},
		{"iptables-nft-save"},
		{"ip6tables-nft-save"},
		{"iptables-legacy-save"},
		{"ip6tables-legacy-save"},
	} {
		out, err := exec.CommandContext(ctx, "nsenter", append([]string{"--net=" + netns, "--"}, cmd...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s in %s: %v: %s", cmd[0], netns, err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "PROXY_INIT") || strings.Contains(l, "proxy_init") || strings.Contains(l, "proxy-init/") {
				lines = append(lines, strings.TrimSpace(l))
			}
		}
	}
	return lines
}

// podLog returns what a container of a pod logged so far (every restart), read from its node's
// pod log directory: the kubelet here serves no `kubectl logs`.
func podLog(t testing.TB, c *Cluster, p *corev1.Pod, container string) string {
	t.Helper()
	dir := c.NodeOf(t, p).Path(fmt.Sprintf("/var/lib/pod-logs/%s_%s_%s/%s", p.Namespace, p.Name, p.UID, container))
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	var b strings.Builder
	for _, f := range files {
		data, _ := os.ReadFile(f)
		b.Write(data)
	}
	return b.String()
}

// watchPods watches the pods of ns from now on. The watch resumes where it was when the API
// server ends it (a loaded API server closes watches it finds slow), so no event is missed; its
// channel closes only when it is stopped or cannot resume.
func watchPods(ctx context.Context, t *testing.T, c *Cluster, ns string) watch.Interface {
	t.Helper()
	pods := c.Client.CoreV1().Pods(ns)
	list, err := pods.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, &cache.ListWatch{
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) { return pods.Watch(ctx, o) },
	})
	if err != nil {
		t.Fatal(err)
	}
	return w
}
