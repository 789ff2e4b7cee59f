package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/wire"
)

var everything = labels.Everything()

// errNotSeen is a lookup of an object the watch has not delivered within the lookup wait: the
// plugin then asks the API itself.
var errNotSeen = errors.New("not seen by the agent's watch")

// cacheAPI is the plugin's PodAPI over the agent's watch caches. It answers only for pods of the
// agent's node (the pod watch holds no other), and waits at most the lookup wait for a pod or
// namespace the watch has not delivered yet.
type cacheAPI struct {
	a *Agent
	// uid, when set (K8S_POD_UID), is the pod incarnation asked about: an older pod of the same
	// name still in the cache does not answer for it.
	uid types.UID
	// source is wire.SourceKubelet once the pod came from the kubelet.
	source string
}

func (c *cacheAPI) Cached() bool { return true }

func (c *cacheAPI) Pod(ctx context.Context, namespace, name string) (*cniplugin.Pod, error) {
	p, err := c.pod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	return pluginPod(p), nil
}

func (c *cacheAPI) pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	var pod *corev1.Pod
	found := func() bool {
		p, err := c.a.pods.Pods(namespace).Get(name)
		pod = p // used only once found
		return err == nil && (c.uid == "" || p.UID == c.uid)
	}
	if found() {
		return pod, nil
	}
	// The kubelet, which is setting the pod up, knows it now; the watch may take a moment more.
	if p, err := c.fromKubelet(ctx, namespace, name); err == nil {
		return p, nil
	}
	if !c.wait(ctx, found) {
		return nil, fmt.Errorf("pod %s/%s (uid %q) is not among the pods of node %s after %s: %w", namespace, name, c.uid, c.a.opts.NodeName, c.a.opts.LookupWait, errNotSeen)
	}
	return pod, nil
}

// fromKubelet reads the pod from the kubelet's pods API, when the agent has it, and remembers
// that it did (the reply's Source).
func (c *cacheAPI) fromKubelet(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	if c.a.kubelet == nil {
		return nil, errors.New("the kubelet's pods API is not configured (--kubelet-pods-socket)")
	}
	p, err := c.a.kubelet.pod(ctx, namespace, name, c.uid)
	if err != nil {
		c.a.log.Debug("the kubelet did not give the pod", "pod", namespace+"/"+name, "uid", string(c.uid), "error", err.Error())
		return nil, err
	}
	c.source = wire.SourceKubelet
	return p, nil
}

func (c *cacheAPI) Namespace(ctx context.Context, name string) (*cniplugin.Namespace, error) {
	ns, err := c.namespace(ctx, name)
	if err != nil {
		return nil, err
	}
	return &cniplugin.Namespace{ObjectMeta: pluginMeta(ns.ObjectMeta)}, nil
}

func (c *cacheAPI) namespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	var ns *corev1.Namespace
	if !c.wait(ctx, func() bool {
		n, err := c.a.namespaces.Get(name)
		ns = n
		return err == nil
	}) {
		return nil, fmt.Errorf("namespace %s is not in the agent's watch after %s: %w", name, c.a.opts.LookupWait, errNotSeen)
	}
	return ns, nil
}

// Service answers for default/kubernetes only, from its one-object watch; without it, the
// plugin's own fallback (443 and 6443) applies, as when the API refuses the read.
func (c *cacheAPI) Service(_ context.Context, namespace, name string) (*cniplugin.Service, error) {
	s, err := c.a.services.Services(namespace).Get(name)
	if err != nil {
		return nil, fmt.Errorf("service %s/%s: not in the agent's watch: %w", namespace, name, err)
	}
	return recode[cniplugin.Service](s)
}

func (c *cacheAPI) wait(ctx context.Context, found func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, c.a.opts.LookupWait)
	defer cancel()
	return c.a.arrived.wait(ctx, found)
}

// lookup is the answer to a plugin's ADD or CHECK once the watches have synced (see reply); an
// error when the pod or its namespace is not known within the lookup wait. A pod the watch has
// not delivered yet comes from the kubelet when it can.
func (c *cacheAPI) lookup(ctx context.Context, namespace, name string) (wire.Reply, error) {
	pod, err := c.pod(ctx, namespace, name)
	if err != nil {
		return wire.Reply{}, err
	}
	ns, err := c.namespace(ctx, namespace)
	if err != nil {
		return wire.Reply{}, err
	}
	return c.reply(pod, ns, "")
}

// unsyncedLookup is the answer before the watches have synced (the API server may be down): the
// pod from the kubelet, its namespace from the namespace watch if synced, else from one API read;
// failing both, the reply says why in place of the namespace (the plugin fails a pod needing it).
func (c *cacheAPI) unsyncedLookup(ctx context.Context, namespace, name string) (wire.Reply, error) {
	pod, err := c.fromKubelet(ctx, namespace, name)
	if err != nil {
		return wire.Reply{}, err
	}
	var ns *corev1.Namespace
	var nsErr string
	if c.a.nsInf.HasSynced() {
		ns, err = c.namespace(ctx, namespace)
	} else {
		rctx, cancel := context.WithTimeout(ctx, c.a.opts.LookupWait)
		ns, err = c.a.client.Namespaces().Get(rctx, namespace, metav1.GetOptions{ResourceVersion: "0"})
		cancel()
	}
	if err != nil {
		nsErr = fmt.Sprintf("namespace %s: the agent's namespace watch has not synced and the API server did not answer within %s: %v", namespace, c.a.opts.LookupWait, err)
		ns = nil
	}
	return c.reply(pod, ns, nsErr)
}

// reply encodes the pod, its namespace (or why there is none) and default/kubernetes when the
// service watch holds it, as the plugin reads them: only its own small types cross the socket.
func (c *cacheAPI) reply(pod *corev1.Pod, ns *corev1.Namespace, nsErr string) (wire.Reply, error) {
	r := wire.Reply{Source: c.source, NamespaceError: nsErr}
	var err error
	r.Pod, err = json.Marshal(pluginPod(pod))
	if err == nil && ns != nil {
		r.Namespace, err = json.Marshal(cniplugin.Namespace{ObjectMeta: pluginMeta(ns.ObjectMeta)})
	}
	if svc, serr := c.Service(context.Background(), "default", "kubernetes"); serr == nil && err == nil {
		r.Service, err = json.Marshal(svc)
	}
	return r, err
}

// recode turns a core/v1 object into the plugin's own small type T through its JSON, the way the
// plugin decodes the API server's answer.
func recode[T any](from any) (*T, error) {
	b, err := json.Marshal(from)
	if err != nil {
		return nil, err
	}
	var v T
	return &v, json.Unmarshal(b, &v)
}

// pluginPod is pod as recode gives it (TestPluginPodIsRecode) without its JSON round trip, a
// tenth of a millisecond of each route-1 ADD. Maps are copied: the watch's objects are shared.
func pluginPod(pod *corev1.Pod) *cniplugin.Pod {
	return &cniplugin.Pod{ObjectMeta: pluginMeta(pod.ObjectMeta), Spec: pluginSpec(&pod.Spec)}
}

func pluginMeta(m metav1.ObjectMeta) cniplugin.ObjectMeta {
	clone := func(m map[string]string) map[string]string {
		if len(m) == 0 {
			return nil // omitempty: none in the JSON
		}
		return maps.Clone(m)
	}
	return cniplugin.ObjectMeta{Name: m.Name, Namespace: m.Namespace, Labels: clone(m.Labels), Annotations: clone(m.Annotations)}
}

func pluginSpec(s *corev1.PodSpec) cniplugin.PodSpec {
	containers := func(cs []corev1.Container) []cniplugin.Container {
		if cs == nil {
			return nil
		}
		out := make([]cniplugin.Container, len(cs))
		for i, c := range cs {
			out[i].Name = c.Name
			if c.RestartPolicy != nil {
				out[i].RestartPolicy = string(*c.RestartPolicy)
			}
		}
		return out
	}
	return cniplugin.PodSpec{InitContainers: containers(s.InitContainers), Containers: containers(s.Containers)}
}
