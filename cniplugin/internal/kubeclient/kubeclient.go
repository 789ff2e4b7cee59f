// Package kubeclient is the Kubernetes client of the DaemonSet's commands (install, agent,
// repair): typed calls on the few resources they use, over client-go's REST client, with a
// scheme of core/v1, apps/v1 and events.k8s.io/v1 only.
//
// client-go's Clientset, typed clients and informer factory register every API group in one
// scheme, so any of them links every group's types, codecs, listers and informers: more than half
// of the DaemonSet binary; its generic typed client (gentype) links the fake clients, OpenAPI and
// strategic merge patching. The requests here are the ones the typed clients send.
package kubeclient

import (
	"cmp"
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

var (
	scheme         = runtime.NewScheme()
	codecs         = serializer.NewCodecFactory(scheme)
	parameterCodec = runtime.NewParameterCodec(scheme)
)

func init() {
	// The unversioned meta types (Status, WatchEvent, the options) under "v1", as client-go's
	// scheme has them, then the three groups.
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
	utilruntime.Must(corev1.AddToScheme(scheme))
	utilruntime.Must(appsv1.AddToScheme(scheme))
	utilruntime.Must(eventsv1.AddToScheme(scheme))
}

// Client makes the DaemonSet's API calls. Each method returns the calls on one resource.
type Client struct {
	core, apps, events rest.Interface
}

// New returns a client for cfg. Its three REST clients share one HTTP client (one connection
// pool, one token file watch), as the Clientset's groups do.
func New(cfg *rest.Config) (*Client, error) {
	c := *cfg
	c.UserAgent = cmp.Or(c.UserAgent, rest.DefaultKubernetesUserAgent())
	httpClient, err := rest.HTTPClientFor(&c)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client for %s: %w", c.Host, err)
	}
	var k Client
	for _, g := range []struct {
		client  *rest.Interface
		gv      schema.GroupVersion
		apiPath string
	}{
		{&k.core, corev1.SchemeGroupVersion, "/api"},
		{&k.apps, appsv1.SchemeGroupVersion, "/apis"},
		{&k.events, eventsv1.SchemeGroupVersion, "/apis"},
	} {
		gc := c
		gc.GroupVersion, gc.APIPath = &g.gv, g.apiPath
		gc.NegotiatedSerializer = rest.CodecFactoryForGeneratedClient(scheme, codecs).WithoutConversion()
		if *g.client, err = rest.RESTClientForConfigAndClient(&gc, httpClient); err != nil {
			return nil, fmt.Errorf("kubernetes client for %s, %s: %w", c.Host, g.gv, err)
		}
	}
	return &k, nil
}

// Pods are the pods of namespace (metav1.NamespaceAll: of every namespace).
func (k *Client) Pods(namespace string) Resource[*corev1.Pod, *corev1.PodList] {
	return resource[corev1.Pod, corev1.PodList](k.core, "pods", namespace)
}

// Namespaces are the cluster's namespaces.
func (k *Client) Namespaces() Resource[*corev1.Namespace, *corev1.NamespaceList] {
	return resource[corev1.Namespace, corev1.NamespaceList](k.core, "namespaces", "")
}

// Services are the services of namespace.
func (k *Client) Services(namespace string) Resource[*corev1.Service, *corev1.ServiceList] {
	return resource[corev1.Service, corev1.ServiceList](k.core, "services", namespace)
}

// Nodes are the cluster's nodes.
func (k *Client) Nodes() Resource[*corev1.Node, *corev1.NodeList] {
	return resource[corev1.Node, corev1.NodeList](k.core, "nodes", "")
}

// DaemonSets are the DaemonSets of namespace.
func (k *Client) DaemonSets(namespace string) Resource[*appsv1.DaemonSet, *appsv1.DaemonSetList] {
	return resource[appsv1.DaemonSet, appsv1.DaemonSetList](k.apps, "daemonsets", namespace)
}

// Events are the events.k8s.io/v1 Events of namespace.
func (k *Client) Events(namespace string) Resource[*eventsv1.Event, *eventsv1.EventList] {
	return resource[eventsv1.Event, eventsv1.EventList](k.events, "events", namespace)
}

// Resource is the calls on one resource, of objects T listed as L (pointers to the API types),
// in one namespace or, for "", all of them or a cluster-scoped resource.
type Resource[T, L runtime.Object] struct {
	client              rest.Interface
	resource, namespace string
	newObject           func() T
	newList             func() L
}

func resource[O, L any, PO interface {
	*O
	runtime.Object
}, PL interface {
	*L
	runtime.Object
}](client rest.Interface, resource, namespace string) Resource[PO, PL] {
	return Resource[PO, PL]{client, resource, namespace, func() PO { return new(O) }, func() PL { return new(L) }}
}

// request is verb on the resource (and the object name, when not ""), protobuf preferred.
func (r Resource[T, L]) request(req *rest.Request, name string) *rest.Request {
	req = req.UseProtobufAsDefault().NamespaceIfScoped(r.namespace, r.namespace != "").Resource(r.resource)
	if name != "" {
		req = req.Name(name)
	}
	return req
}

func into[O runtime.Object](res rest.Result, obj O) (O, error) {
	return obj, res.Into(obj)
}

// Get reads the object called name.
func (r Resource[T, L]) Get(ctx context.Context, name string, opts metav1.GetOptions) (T, error) {
	return into(r.request(r.client.Get(), name).VersionedParams(&opts, parameterCodec).Do(ctx), r.newObject())
}

// List reads the objects opts selects.
func (r Resource[T, L]) List(ctx context.Context, opts metav1.ListOptions) (L, error) {
	return into(r.request(r.client.Get(), "").VersionedParams(&opts, parameterCodec).
		Timeout(timeoutOf(opts)).Do(ctx), r.newList())
}

// Watch watches the objects opts selects.
func (r Resource[T, L]) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return r.request(r.client.Get(), "").VersionedParams(&opts, parameterCodec).Timeout(timeoutOf(opts)).Watch(ctx)
}

// Create creates obj.
func (r Resource[T, L]) Create(ctx context.Context, obj T, opts metav1.CreateOptions) (T, error) {
	return into(r.request(r.client.Post(), "").VersionedParams(&opts, parameterCodec).Body(obj).Do(ctx), r.newObject())
}

// Delete deletes the object called name.
func (r Resource[T, L]) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	return r.request(r.client.Delete(), name).Body(&opts).Do(ctx).Error()
}

// Patch patches the object called name with data, a patch of type pt.
func (r Resource[T, L]) Patch(ctx context.Context, name string, pt types.PatchType, data []byte, opts metav1.PatchOptions) (T, error) {
	return into(r.request(r.client.Patch(pt), name).VersionedParams(&opts, parameterCodec).Body(data).Do(ctx), r.newObject())
}

// timeoutOf is a list's or watch's own timeout, which bounds the request too.
func timeoutOf(opts metav1.ListOptions) time.Duration {
	if opts.TimeoutSeconds == nil {
		return 0
	}
	return time.Duration(*opts.TimeoutSeconds) * time.Second
}

// Informer returns an informer of the objects r lists, with tweak (when not nil) applied to
// every list and watch, indexed by namespace: the informer client-go's factory makes.
func (r Resource[T, L]) Informer(resync time.Duration, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	if tweak == nil {
		tweak = func(*metav1.ListOptions) {}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			tweak(&opts)
			return r.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			tweak(&opts)
			return r.Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformerWithOptions(lw, r.newObject(), cache.SharedIndexInformerOptions{
		ResyncPeriod: resync,
		Indexers:     cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc},
	})
}
