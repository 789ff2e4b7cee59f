// Package kubeapi is the linkerd-cni plugin's Kubernetes API client: the pod lookup over the
// plugin's kubeconfig (its linkerd-cni-context), with a lean client-go REST client that decodes
// only the few fields the plugin reads (package cniplugin's own small types), in at most three
// GETs per pod.
//
// Limits: it is linked only where the API is read directly: the companion binary
// linkerd-cni-api, which the node's plugin runs for the calls the node agent does not take, and
// the DaemonSet's full binary. The node's plugin itself (cmd/linkerd-cni built -tags pluginonly)
// must not link it: client-go's package initialisation would run on every pod's sandbox set-up.
package kubeapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/internal/buildinfo"
	"github.com/kubemesh/proxy-init/internal/kubeconfig"
)

// coreV1 is the API group and version of pods, namespaces and services.
var coreV1 = schema.GroupVersion{Version: "v1"}

// statusCodecs decodes only metav1.Status, the body of an API error, so that client-go can turn a
// failed request into a typed error (unauthorized, not found...). The objects themselves are
// decoded with encoding/json into the plugin's own small types (cniplugin/pod.go). Building it lazily keeps
// it off the path of VERSION, DEL and pass-through ADDs.
var statusCodecs = sync.OnceValue(func() serializer.CodecFactory {
	s := runtime.NewScheme()
	metav1.AddToGroupVersion(s, coreV1)
	return serializer.NewCodecFactory(s)
})

// loadKubeconfig reads the kubeconfig at path and returns the REST config of its
// linkerd-cni-context. apiRoot, when set (kubernetes.k8s_api_root), replaces the server URL.
// Nothing is sent to the API.
func loadKubeconfig(path, apiRoot string) (*rest.Config, error) {
	if path == "" {
		return nil, errors.New("no kubeconfig: set kubernetes.kubeconfig in the network config")
	}
	raw, err := clientcmd.LoadFromFile(path)
	if err != nil {
		return nil, fmt.Errorf("read kubeconfig %s: %w", path, err)
	}
	overrides := &clientcmd.ConfigOverrides{}
	if apiRoot != "" {
		overrides.ClusterInfo = clientcmdapi.Cluster{Server: apiRoot}
	}
	cfg, err := clientcmd.NewNonInteractiveClientConfig(*raw, kubeconfig.Context, overrides, nil).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s, context %s: %w", path, kubeconfig.Context, err)
	}
	return cfg, nil
}

// kubeClient is the plugin's PodAPI over the API: plain GETs on a core/v1 REST client.
type kubeClient struct {
	rc         *rest.RESTClient
	kubeconfig string
	host       string
}

// NewKubeClient returns a PodAPI that reads through the kubeconfig's linkerd-cni-context. Its
// errors say plainly when the API is unreachable, timed out or refused the credentials, and name
// the kubeconfig.
func NewKubeClient(conf *cniplugin.NetConf) (cniplugin.PodAPI, error) {
	cfg, err := loadKubeconfig(conf.Kubernetes.Kubeconfig, conf.Kubernetes.APIRoot)
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.APIPath = "/api"
	cfg.GroupVersion = &coreV1
	cfg.NegotiatedSerializer = statusCodecs().WithoutConversion()
	// JSON into the few fields the plugin reads costs microseconds. Decoding into core/v1's
	// types would need their scheme, whose size slows every start (see cniplugin/pod.go).
	cfg.ContentType = runtime.ContentTypeJSON
	cfg.AcceptContentTypes = runtime.ContentTypeJSON
	cfg.UserAgent = "linkerd-cni/" + buildinfo.Version
	cfg.Timeout = conf.APITimeout()
	// Three requests at most: the client-side rate limiter would only add latency.
	cfg.QPS, cfg.Burst = -1, 0
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: build the API client: %w", conf.Kubernetes.Kubeconfig, err)
	}
	return &kubeClient{rc: rc, kubeconfig: conf.Kubernetes.Kubeconfig, host: cfg.Host}, nil
}

func (k *kubeClient) Pod(ctx context.Context, namespace, name string) (*cniplugin.Pod, error) {
	var pod cniplugin.Pod
	return &pod, k.get(ctx, "get pod "+namespace+"/"+name, &pod, namespace, "pods", name)
}

func (k *kubeClient) Namespace(ctx context.Context, name string) (*cniplugin.Namespace, error) {
	var ns cniplugin.Namespace
	return &ns, k.get(ctx, "get namespace "+name, &ns, "", "namespaces", name)
}

func (k *kubeClient) Service(ctx context.Context, namespace, name string) (*cniplugin.Service, error) {
	var svc cniplugin.Service
	return &svc, k.get(ctx, "get service "+namespace+"/"+name, &svc, namespace, "services", name)
}

// get reads one object. It asks for resourceVersion 0, which the apiserver answers from its watch
// cache instead of a quorum read, saving each lookup a round trip to etcd (docs/performance.md):
// the cache trails etcd by milliseconds, and a pod, its namespace and the kubernetes service all
// exist well before the pod's sandbox does. An object the cache has not seen yet is read again
// from etcd.
func (k *kubeClient) get(ctx context.Context, what string, into any, namespace, resource, name string) error {
	req := func() *rest.Request {
		return k.rc.Get().NamespaceIfScoped(namespace, namespace != "").Resource(resource).Name(name)
	}
	body, err := req().Param("resourceVersion", "0").Do(ctx).Raw()
	if apierrors.IsNotFound(err) {
		body, err = req().Do(ctx).Raw()
	}
	if err != nil {
		return k.explain(ctx, what, err)
	}
	if err := json.Unmarshal(body, into); err != nil {
		return fmt.Errorf("%s: decode the answer of %s: %w", what, k.host, err)
	}
	return nil
}

// explain turns a client error into a message an operator can act on. The original error stays
// wrapped, so apierrors predicates still work on it.
func (k *kubeClient) explain(ctx context.Context, what string, err error) error {
	where := fmt.Sprintf("the Kubernetes API at %s (kubeconfig %s, context %s)", k.host, k.kubeconfig, kubeconfig.Context)
	var ne net.Error
	switch {
	case apierrors.IsUnauthorized(err):
		return fmt.Errorf("%s: unauthorized: %s rejected the credentials; the token may be revoked or expired: %w", what, where, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%s: forbidden: %s denies the linkerd-cni user; check its ClusterRole: %w", what, where, err)
	case apierrors.IsNotFound(err):
		return fmt.Errorf("%s: not found in %s: %w", what, where, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(ctx.Err(), context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout(), apierrors.IsTimeout(err), apierrors.IsServerTimeout(err):
		return fmt.Errorf("%s: timed out waiting for %s: %w", what, where, err)
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s: %s: %w", what, where, err)
	}
	return fmt.Errorf("%s: %s is unreachable or failed: %w", what, where, err)
}
