package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
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
}

func (c *cacheAPI) Cached() bool { return true }

func (c *cacheAPI) Pod(ctx context.Context, namespace, name string) (*cniplugin.Pod, error) {
	p, err := c.pod(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	var pod cniplugin.Pod
	return &pod, recode(p, &pod)
}

func (c *cacheAPI) pod(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	var pod *corev1.Pod
	found := func() bool {
		p, err := c.a.pods.Pods(namespace).Get(name)
		if err == nil && (c.uid == "" || p.UID == c.uid) {
			pod = p
			return true
		}
		return false
	}
	if !c.wait(ctx, found) {
		return nil, fmt.Errorf("pod %s/%s (uid %q) is not among the pods of node %s after %s: %w", namespace, name, c.uid, c.a.node, c.a.opts.LookupWait, errNotSeen)
	}
	return pod, nil
}

func (c *cacheAPI) Namespace(ctx context.Context, name string) (*cniplugin.Namespace, error) {
	n, err := c.namespace(ctx, name)
	if err != nil {
		return nil, err
	}
	var ns cniplugin.Namespace
	return &ns, recode(n, &ns)
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
	var svc cniplugin.Service
	return &svc, recode(s, &svc)
}

func (c *cacheAPI) wait(ctx context.Context, found func() bool) bool {
	ctx, cancel := context.WithTimeout(ctx, c.a.opts.LookupWait)
	defer cancel()
	return c.a.arrived.wait(ctx, found)
}

// lookup is the answer to a plugin's ADD or CHECK: the pod, its namespace and, when the watch
// holds it, default/kubernetes, as the plugin reads them (its own small types: nothing else of
// the objects crosses the socket); an error when the pod or its namespace is not known within the
// lookup wait.
func (c *cacheAPI) lookup(ctx context.Context, namespace, name string) (wire.Reply, error) {
	pod, err := c.Pod(ctx, namespace, name)
	if err != nil {
		return wire.Reply{}, err
	}
	ns, err := c.Namespace(ctx, namespace)
	if err != nil {
		return wire.Reply{}, err
	}
	r := wire.Reply{}
	if r.Pod, err = json.Marshal(pod); err == nil {
		r.Namespace, err = json.Marshal(ns)
	}
	if svc, serr := c.Service(ctx, "default", "kubernetes"); serr == nil && err == nil {
		r.Service, err = json.Marshal(svc)
	}
	return r, err
}

// recode turns a core/v1 object into the plugin's own small type through its JSON, the way the
// plugin decodes the API server's answer, so both paths read exactly the same fields.
func recode(from, into any) error {
	b, err := json.Marshal(from)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, into)
}
