package install

// Tests of --node-taint: the option's validation, and against a real kube-apiserver
// (test/kubetest) with the deploy/ RBAC, a TokenRequest token for the linkerd-cni
// ServiceAccount and the in-process installer on temp dirs: the startup taint goes only once
// every CNI config file carries the plugin, other taints stay, and without the option (or
// without the optional RBAC) the node is never patched. The optional admission policy lets a
// token bound to a node's pod remove taints from that node and do nothing else.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/cniplugin/repair"
	"github.com/kubemesh/proxy-init/test/kubetest"
)

func TestNodeTaintOptions(t *testing.T) {
	base := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443",
		"KUBERNETES_NODE_NAME": "node-1"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	t.Run("ConfigFromEnv", func(t *testing.T) {
		tests := []struct {
			name    string
			env     map[string]string
			taint   string
			wantErr string
		}{
			{"off by default", base, "", ""},
			{"from the environment", with(EnvNodeTaint, "linkerd.io/cni-not-ready"), "linkerd.io/cni-not-ready", ""},
			{"key without prefix", with(EnvNodeTaint, "cni-not-ready"), "cni-not-ready", ""},
			{"invalid key", with(EnvNodeTaint, "not a key!"), "", `--node-taint "not a key!": not a valid taint key`},
			{"no node name", with(EnvNodeTaint, "linkerd.io/cni-not-ready", "KUBERNETES_NODE_NAME", ""), "",
				`KUBERNETES_NODE_NAME "": not set, and --node-taint needs the node's name`},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				cfg, err := ConfigFromEnv(envFrom(tt.env))
				if tt.wantErr != "" {
					if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
						t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if cfg.NodeTaint != tt.taint {
					t.Errorf("NodeTaint = %q, want %q", cfg.NodeTaint, tt.taint)
				}
			})
		}
	})
	t.Run("Main", func(t *testing.T) {
		tests := []struct {
			name string
			args []string
			env  map[string]string
			want string
		}{
			{"invalid key", []string{"--node-taint=bad key"}, base, `--node-taint "bad key": not a valid taint key`},
			{"no node name", []string{"--node-taint", "linkerd.io/cni-not-ready"}, with("KUBERNETES_NODE_NAME", ""),
				"--node-taint needs the node's name"},
			{"the flag wins over the environment", []string{"--node-taint=bad key"}, with(EnvNodeTaint, "good"),
				`--node-taint "bad key"`},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				var stderr bytes.Buffer
				if code := mainWith(tt.args, envFrom(tt.env), &stderr); code != 2 || !strings.Contains(stderr.String(), tt.want) {
					t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, stderr.String(), tt.want)
				}
			})
		}
		var stderr bytes.Buffer
		mainWith([]string{"--help"}, envFrom(base), &stderr)
		if !strings.Contains(stderr.String(), "--node-taint") {
			t.Errorf("--help does not list --node-taint:\n%s", stderr.String())
		}
	})
}

// startupTaint is the taint the tests' nodes are born with, as with
// kubelet --register-with-taints=linkerd.io/cni-not-ready=true:NoSchedule.
const startupTaint = "linkerd.io/cni-not-ready"

// brokenConflist is a config file the installer cannot patch (it stays unready).
const brokenConflist = `{"cniVersion":"0.3.1","name":"broken","plugins":[`

// ciliumConflist is the fixed version of the broken file.
const ciliumConflist = `{"cniVersion":"0.3.1","name":"cilium","plugins":[{"type":"cilium-cni","enable-debug":false}]}`

// taintWorld is a kube-apiserver with the deploy/ RBAC.
type taintWorld struct {
	cluster *kubetest.Cluster
	api     *apiClient
	saUser  string
}

func newTaintWorld(t *testing.T, ctx context.Context) *taintWorld {
	t.Helper()
	cluster := kubetest.Start(t, kubetest.Options{})
	w := &taintWorld{cluster: cluster, api: newAPIClient(t, cluster.AdminConfig()),
		saUser: kubetest.ServiceAccountUser("linkerd-cni", "linkerd-cni")}
	for _, m := range loadManifests(t, filepath.Join(deployDir(t), "linkerd-cni")) {
		if m.obj.GetKind() == "Namespace" || isAccess(m) {
			if _, err := w.api.apply(ctx, m.obj, false); err != nil {
				t.Fatalf("apply %s: %v", m, err)
			}
		}
	}
	return w
}

// boundToken mints a token for the linkerd-cni ServiceAccount bound to a new pod on node
// (tokenBoundTo), which optional/node-taint-policy.yaml checks.
func boundToken(t *testing.T, ctx context.Context, cs kubernetes.Interface, node string) string {
	t.Helper()
	return tokenBoundTo(ctx, t, cs, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "linkerd-cni-" + node, Namespace: "linkerd-cni"},
		Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: "linkerd-cni",
			Containers: []corev1.Container{{Name: "install-cni", Image: "registry.invalid/linkerd-cni:1"}}},
	})
}

// applyOptional applies deploy/linkerd-cni/optional, the RBAC and the admission policy
// (idempotent).
func (w *taintWorld) applyOptional(t *testing.T, ctx context.Context) {
	t.Helper()
	for _, m := range loadManifests(t, filepath.Join(deployDir(t), "linkerd-cni", "optional")) {
		if _, err := w.api.apply(ctx, m.obj, false); err != nil {
			t.Fatalf("apply %s: %v", m, err)
		}
	}
}

// otherTaints are on every test node and must survive.
var otherTaints = []corev1.Taint{
	{Key: "example.com/dedicated", Value: "mesh", Effect: corev1.TaintEffectNoSchedule},
	{Key: "example.com/gpu", Effect: corev1.TaintEffectPreferNoSchedule},
}

// createNode creates a node carrying the startup taint with two effects, between other taints,
// and returns it as stored.
func (w *taintWorld) createNode(t *testing.T, ctx context.Context, name string) *corev1.Node {
	t.Helper()
	taints := []corev1.Taint{
		otherTaints[0],
		{Key: startupTaint, Value: "true", Effect: corev1.TaintEffectNoSchedule},
		otherTaints[1],
		{Key: startupTaint, Effect: corev1.TaintEffectNoExecute},
	}
	n, err := w.cluster.Clientset.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{Taints: taints},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func (w *taintWorld) taints(t *testing.T, ctx context.Context, node string) []corev1.Taint {
	t.Helper()
	n, err := w.cluster.Clientset.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.Taints
}

func hasTaint(taints []corev1.Taint, key string) bool {
	for _, tn := range taints {
		if tn.Key == key {
			return true
		}
	}
	return false
}

// nodeRequests returns the ServiceAccount's audited requests on node, after making sure the
// audit log is current: the admin reads the node and that read is waited for (the log is
// written synchronously, so every request completed before it is already there).
func (w *taintWorld) nodeRequests(t *testing.T, ctx context.Context, node string) []kubetest.AuditEvent {
	t.Helper()
	before, err := w.cluster.AuditEvents(kubetest.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	w.taints(t, ctx, node)
	isMarker := func(e kubetest.AuditEvent) bool {
		return e.Verb == "get" && e.Resource() == "nodes" && e.ObjectRef.Name == node
	}
	count := func(evs []kubetest.AuditEvent) int {
		n := 0
		for _, e := range evs {
			if isMarker(e) {
				n++
			}
		}
		return n
	}
	n0 := count(before)
	if _, err := w.cluster.WaitAuditEvents(ctx, kubetest.AdminUser, func(evs []kubetest.AuditEvent) bool {
		return count(evs) > n0
	}); err != nil {
		t.Fatal(err)
	}
	evs, err := w.cluster.AuditEvents(w.saUser)
	if err != nil {
		t.Fatal(err)
	}
	var out []kubetest.AuditEvent
	for _, e := range evs {
		if e.Resource() == "nodes" && e.ObjectRef.Name == node {
			out = append(out, e)
		}
	}
	return out
}

func verbs(evs []kubetest.AuditEvent) []string {
	var out []string
	for _, e := range evs {
		out = append(out, e.Verb+"="+itoa(int64(e.Code())))
	}
	return out
}

// taintHost is a host whose installer talks to the test cluster with the ServiceAccount's
// token, and which records when the installer last wrote each file.
type taintHost struct {
	*host
	mu    sync.Mutex
	wrote map[string]time.Time
}

// newHost lays out a node's directories and a service-account volume holding a token bound to
// a pod on node.
func (w *taintWorld) newHost(t *testing.T, ctx context.Context, node, taint string) *taintHost {
	t.Helper()
	h := &taintHost{host: newHost(t), wrote: map[string]time.Time{}}
	token := boundToken(t, ctx, w.cluster.Clientset, node)
	h.cfg.ServiceHost, h.cfg.ServicePort = h.projectClusterSA(t, w.cluster, token)
	h.cfg.NodeName = node
	h.cfg.NodeTaint = taint
	h.cfg.taintBackoff, h.cfg.taintBackoffMax = 50*time.Millisecond, 200*time.Millisecond
	count := h.cfg.onWrite
	h.cfg.onWrite = func(p string) {
		count(p)
		h.mu.Lock()
		h.wrote[filepath.Base(p)] = time.Now()
		h.mu.Unlock()
	}
	return h
}

func (h *taintHost) lastWrite(name string) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.wrote[name]
}

func TestNodeTaintAgainstAPIServer(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: starts kube-apiserver and etcd")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newTaintWorld(t, ctx)

	// First, while the optional RBAC is not applied: the node is readable (the base ClusterRole
	// grants get, for the installer's SIGTERM check) but its patch is refused; the installer says
	// why and what to apply, keeps retrying, and succeeds once the RBAC is there.
	t.Run("refused without the optional RBAC, removed once it is applied", func(t *testing.T) {
		const node = "node-no-rbac"
		w.createNode(t, ctx, node)
		h := w.newHost(t, ctx, node, startupTaint)
		h.write(t, "10-calico.conflist", calicoConflist)
		r := h.start(t)
		r.waitReady(t)
		waitFor(t, 10*time.Second, "the installer to report the refused patch", func() (bool, string) {
			logs := r.logs.String()
			return strings.Contains(logs, "cannot remove the startup taint; retrying") &&
				strings.Contains(logs, "forbidden") && strings.Contains(logs, nodeTaintRBACManifest), logs
		})
		if !hasTaint(w.taints(t, ctx, node), startupTaint) {
			t.Fatal("taint removed although the ServiceAccount may not patch nodes")
		}
		w.applyOptional(t, ctx)
		waitFor(t, 10*time.Second, "the taint to be removed after the RBAC was applied", func() (bool, string) {
			tn := w.taints(t, ctx, node)
			return !hasTaint(tn, startupTaint), taintList(tn)
		})
		evs := w.nodeRequests(t, ctx, node)
		var codes []int
		for _, e := range evs {
			codes = append(codes, e.Code())
		}
		ok := len(evs) >= 4 && evs[len(evs)-1].Verb == "patch" && codes[len(codes)-1] == 200
		for i, e := range evs[:len(evs)-1] {
			switch {
			case e.Verb == "get" && codes[i] != 200, e.Verb == "patch" && codes[i] != 403:
				ok = false
			}
		}
		if !ok || evs[1].Verb != "patch" {
			t.Errorf("the ServiceAccount's node requests answered %v; want each get answered 200 and each patch 403, until a patch answered 200 (requests: %v)", codes, verbs(evs))
		}
		if !strings.Contains(r.logs.String(), "removed the startup taint") {
			t.Error("no log line says the taint was removed")
		}
	})

	t.Run("the admission policy confines the token to removing taints from its own node", func(t *testing.T) {
		w.applyOptional(t, ctx)
		cs := w.cluster.Clientset
		own, other := w.createNode(t, ctx, "node-policy-a"), w.createNode(t, ctx, "node-policy-b")
		token := boundToken(t, ctx, cs, own.Name)
		sa, err := kubernetes.NewForConfig(w.cluster.ConfigForToken(token))
		if err != nil {
			t.Fatal(err)
		}
		installerClient, err := kubeclient.New(w.cluster.ConfigForToken(token))
		if err != nil {
			t.Fatal(err)
		}
		// The mechanism the policy relies on: the API server names the pod's node in the
		// token's user extra.
		review, err := sa.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if got := review.Status.UserInfo.Extra["authentication.kubernetes.io/node-name"]; len(got) != 1 || got[0] != own.Name {
			t.Fatalf("bound token's user extra node-name = %q, want [%s]", got, own.Name)
		}
		unbound, err := w.cluster.TokenFor(ctx, "linkerd-cni", "linkerd-cni")
		if err != nil {
			t.Fatal(err)
		}
		saUnbound, err := kubernetes.NewForConfig(w.cluster.ConfigForToken(unbound))
		if err != nil {
			t.Fatal(err)
		}

		taintsPatch := func(ts []corev1.Taint) []byte {
			b, err := json.Marshal(map[string]any{"spec": map[string]any{"taints": ts}})
			if err != nil {
				t.Fatal(err)
			}
			return b
		}
		without := func(n *corev1.Node) []corev1.Taint {
			var keep []corev1.Taint
			for _, tn := range n.Spec.Taints {
				if tn.Key != startupTaint {
					keep = append(keep, tn)
				}
			}
			return keep
		}
		changedEffect := append([]corev1.Taint{}, own.Spec.Taints...)
		for i := range changedEffect {
			if changedEffect[i].Key == otherTaints[0].Key {
				changedEffect[i].Effect = corev1.TaintEffectNoExecute
			}
		}
		dryPatch := func(client kubernetes.Interface, node string, body []byte) error {
			_, err := client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, body,
				metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})
			return err
		}
		// Policies take effect when the API server has loaded them: wait for a denial.
		labelPatch := []byte(`{"metadata":{"labels":{"example.com/x":"y"}}}`)
		waitFor(t, 15*time.Second, "the admission policy to be in force", func() (bool, string) {
			err := dryPatch(sa, own.Name, labelPatch)
			return err != nil && strings.Contains(err.Error(), "labels"), fmt.Sprint(err)
		})

		tests := []struct {
			name   string
			client kubernetes.Interface
			node   string
			body   []byte
			denied string // "" = allowed
		}{
			{"remove the startup taint from its own node", sa, own.Name, taintsPatch(without(own)), ""},
			{"remove every taint from its own node", sa, own.Name, []byte(`{"spec":{"taints":null}}`), ""},
			{"remove a taint from another node", sa, other.Name, taintsPatch(without(other)), `bound to node "node-policy-a", not "node-policy-b"`},
			{"a token bound to no pod", saUnbound, own.Name, taintsPatch(without(own)), `bound to node "", not "node-policy-a"`},
			{"add a taint", sa, own.Name, taintsPatch(append(append([]corev1.Taint{}, own.Spec.Taints...),
				corev1.Taint{Key: "example.com/new", Effect: corev1.TaintEffectNoSchedule})), "never add or change"},
			{"change a taint's effect", sa, own.Name, taintsPatch(changedEffect), "never add or change"},
			{"add a label", sa, own.Name, labelPatch, "labels"},
			{"add an annotation", sa, own.Name, []byte(`{"metadata":{"annotations":{"example.com/x":"y"}}}`), "annotations"},
			{"cordon", sa, own.Name, []byte(`{"spec":{"unschedulable":true}}`), "nothing in a node's spec"},
			{"set the provider ID", sa, own.Name, []byte(`{"spec":{"providerID":"fake://x"}}`), "nothing in a node's spec"},
			{"an admin is not affected", cs, own.Name, labelPatch, ""},
		}
		for _, tt := range tests {
			err := dryPatch(tt.client, tt.node, tt.body)
			switch {
			case tt.denied == "" && err != nil:
				t.Errorf("%s: refused: %v", tt.name, err)
			case tt.denied != "" && err == nil:
				t.Errorf("%s: allowed, want refused (%q)", tt.name, tt.denied)
			case tt.denied != "" && !(apierrors.IsForbidden(err) && strings.Contains(err.Error(), tt.denied)):
				t.Errorf("%s: refused with %v, want Forbidden mentioning %q", tt.name, err, tt.denied)
			}
		}

		// What the installer sends passes, for real, on its own node only.
		if removed, err := repair.RemoveNodeTaint(ctx, installerClient, own.Name, startupTaint); err != nil || !removed {
			t.Errorf("RemoveNodeTaint on its own node = %v, %v; want true, nil", removed, err)
		}
		if tn := w.taints(t, ctx, own.Name); hasTaint(tn, startupTaint) || !reflect.DeepEqual(tn, without(own)) {
			t.Errorf("taints after RemoveNodeTaint = %v, want %v", taintList(tn), taintList(without(own)))
		}
		if _, err := repair.RemoveNodeTaint(ctx, installerClient, other.Name, startupTaint); !apierrors.IsForbidden(err) {
			t.Errorf("RemoveNodeTaint on another node = %v, want Forbidden", err)
		}
		if !hasTaint(w.taints(t, ctx, other.Name), startupTaint) {
			t.Error("the other node lost its taint")
		}
	})

	t.Run("a node name that is not the token's node is refused, with a hint", func(t *testing.T) {
		w.applyOptional(t, ctx)
		w.createNode(t, ctx, "node-token")
		w.createNode(t, ctx, "node-wrong")
		h := w.newHost(t, ctx, "node-token", startupTaint) // the token is bound to node-token
		h.cfg.NodeName = "node-wrong"
		h.write(t, "10-calico.conflist", calicoConflist)
		r := h.start(t)
		r.waitReady(t)
		waitFor(t, 10*time.Second, "the installer to report the policy's refusal", func() (bool, string) {
			logs := r.logs.String()
			return strings.Contains(logs, "cannot remove the startup taint; retrying") &&
				strings.Contains(logs, "an admission policy refused the patch") &&
				strings.Contains(logs, `bound to node \"node-token\", not \"node-wrong\"`), logs
		})
		for _, n := range []string{"node-token", "node-wrong"} {
			if !hasTaint(w.taints(t, ctx, n), startupTaint) {
				t.Errorf("%s lost its startup taint", n)
			}
		}
	})

	t.Run("removed only after every config file carries the plugin", func(t *testing.T) {
		const node = "node-1"
		w.applyOptional(t, ctx)
		before := w.createNode(t, ctx, node).Spec.Taints
		h := w.newHost(t, ctx, node, startupTaint)
		r := h.start(t)

		// 1. No primary CNI config yet.
		time.Sleep(time.Second)
		if tn := w.taints(t, ctx, node); !reflect.DeepEqual(tn, before) {
			t.Fatalf("taints changed with no CNI config in the net dir: %v", taintList(tn))
		}
		if code, _ := r.ready(t); code != 503 {
			t.Fatalf("/ready = %d with no CNI config", code)
		}

		// 2. A primary config the installer patches, and a second one it cannot: not every
		// file carries the plugin, so the taint must stay.
		h.write(t, "05-cilium.conflist", brokenConflist)
		h.write(t, "10-calico.conflist", calicoConflist)
		waitFor(t, 5*time.Second, "10-calico.conflist to carry the plugin", func() (bool, string) {
			s := h.read(t, "10-calico.conflist")
			return hasLinkerdLast(s), s
		})
		time.Sleep(time.Second)
		if tn := w.taints(t, ctx, node); !reflect.DeepEqual(tn, before) {
			t.Fatalf("taints changed while 05-cilium.conflist lacks the plugin: %v", taintList(tn))
		}
		if evs := w.nodeRequests(t, ctx, node); len(evs) > 0 {
			t.Fatalf("the installer sent node requests before the plugin was in place: %v", verbs(evs))
		}

		// 3. Fix the file: the installer patches it, and only then may the taint go. A watch
		// sees the taint disappear; the files are read at that moment.
		wt, err := w.cluster.Clientset.CoreV1().Nodes().Watch(ctx, metav1.ListOptions{
			FieldSelector: "metadata.name=" + node, ResourceVersion: "0"})
		if err != nil {
			t.Fatal(err)
		}
		defer wt.Stop()
		h.replace(t, "05-cilium.conflist", ciliumConflist)
		var after []corev1.Taint
		deadline := time.After(15 * time.Second)
	watching:
		for {
			select {
			case ev, ok := <-wt.ResultChan():
				if !ok {
					t.Fatal("node watch closed")
				}
				if ev.Type != watch.Modified && ev.Type != watch.Added {
					continue
				}
				n := ev.Object.(*corev1.Node)
				if hasTaint(n.Spec.Taints, startupTaint) {
					continue
				}
				for _, name := range []string{"05-cilium.conflist", "10-calico.conflist"} {
					if s := h.read(t, name); !hasLinkerdLast(s) {
						t.Errorf("taint gone while %s does not carry the plugin:\n%s", name, s)
					}
				}
				after = n.Spec.Taints
				break watching
			case <-deadline:
				t.Fatalf("taint still present 15s after every file carried the plugin: %v\nlogs:\n%s",
					taintList(w.taints(t, ctx, node)), r.logs.String())
			}
		}
		// Every effect of the key went; every other taint stayed, in order (ours, and the
		// not-ready taint the API server's TaintNodesByCondition admission adds).
		var want []corev1.Taint
		for _, tn := range before {
			if tn.Key != startupTaint {
				want = append(want, tn)
			}
		}
		if len(want) < len(otherTaints) || len(want) != len(before)-2 {
			t.Fatalf("the node was created with taints %v", taintList(before))
		}
		if !reflect.DeepEqual(after, want) {
			t.Errorf("taints after removal = %v, want %v", taintList(after), taintList(want))
		}

		// 4. The audit log: every node request came after the installer's write that put the
		// plugin into the last file, and exactly one of them was a successful patch.
		fixed := h.lastWrite("05-cilium.conflist")
		if fixed.IsZero() {
			t.Fatal("the installer never wrote 05-cilium.conflist")
		}
		evs := w.nodeRequests(t, ctx, node)
		patches := 0
		for _, e := range evs {
			if e.RequestReceivedTimestamp.Before(fixed.Truncate(time.Microsecond)) {
				t.Errorf("%s on the node at %s, before the plugin was written at %s",
					e.Verb, e.RequestReceivedTimestamp.Format(time.StampMicro), fixed.Format(time.StampMicro))
			}
			if e.Verb == "patch" {
				patches++
				if e.Code() != 200 {
					t.Errorf("node patch answered %d", e.Code())
				}
			}
		}
		if patches != 1 {
			t.Errorf("%d node patches, want 1 (requests: %v)", patches, verbs(evs))
		}
		t.Logf("plugin written at %s; node requests: %v", fixed.Format(time.StampMicro), verbs(evs))

		// 5. Once is enough: a primary rewrite and its re-patch send nothing more, and
		// uninstalling does not put the taint back.
		h.replace(t, "10-calico.conflist", calicoConflist)
		waitFor(t, 5*time.Second, "the plugin back in 10-calico.conflist", func() (bool, string) {
			s := h.read(t, "10-calico.conflist")
			return hasLinkerdLast(s), s
		})
		time.Sleep(300 * time.Millisecond)
		if err := r.stop(t); err != nil {
			t.Fatalf("uninstall: %v", err)
		}
		if again := w.nodeRequests(t, ctx, node); len(again) != len(evs) {
			t.Errorf("more node requests after the taint was removed: %v, then %v", verbs(evs), verbs(again))
		}
		if tn := w.taints(t, ctx, node); !reflect.DeepEqual(tn, want) {
			t.Errorf("taints after uninstall = %v, want %v", taintList(tn), taintList(want))
		}
	})

	t.Run("without --node-taint the node is never touched", func(t *testing.T) {
		const node = "node-no-flag"
		w.applyOptional(t, ctx)
		before := w.createNode(t, ctx, node).Spec.Taints
		h := w.newHost(t, ctx, node, "")
		h.write(t, "10-calico.conflist", calicoConflist)
		r := h.start(t)
		r.waitReady(t)
		time.Sleep(time.Second)
		if tn := w.taints(t, ctx, node); !reflect.DeepEqual(tn, before) {
			t.Errorf("taints changed without --node-taint: %v", taintList(tn))
		}
		if evs := w.nodeRequests(t, ctx, node); len(evs) > 0 {
			t.Errorf("node requests without --node-taint: %v", verbs(evs))
		}
		if strings.Contains(r.logs.String(), "startup taint") {
			t.Errorf("the installer mentions a taint without --node-taint:\n%s", r.logs.String())
		}
	})
}

// taintList renders taints as key=value:effect.
func taintList(ts []corev1.Taint) string {
	var parts []string
	for _, tn := range ts {
		parts = append(parts, tn.ToString())
	}
	return "[" + strings.Join(parts, " ") + "]"
}
