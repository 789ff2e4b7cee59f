package cniplugin

// The plugin's Kubernetes API client, on the standard library: plain GETs of a pod, a namespace
// and a Service over the installer's kubeconfig (internal/kubeconfig). Three requests per call do
// not need client-go, whose package initialisation alone would cost every plugin start.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"

	"github.com/kubemesh/proxy-init/internal/buildinfo"
	"github.com/kubemesh/proxy-init/internal/kubeconfig"
)

// maxObject bounds an API answer the plugin reads (etcd's own limit on an object is 1.5 MiB).
const maxObject = 8 << 20

// kubeClient is the plugin's PodAPI over the API server.
type kubeClient struct {
	http          *http.Client
	server, token string
	what          string // the API server and the kubeconfig, for messages
}

// NewKubeClient returns a PodAPI that reads through the kubeconfig's linkerd-cni-context
// (kubernetes.k8s_api_root, when set, replaces its server), within the config's API timeout.
func NewKubeClient(conf *NetConf) (PodAPI, error) {
	path := conf.Kubernetes.Kubeconfig
	if path == "" {
		return nil, errors.New("no kubeconfig: set kubernetes.kubeconfig in the network config")
	}
	kc, err := kubeconfig.Read(path)
	if err != nil {
		return nil, err
	}
	if root := conf.Kubernetes.APIRoot; root != "" {
		if err := kubeconfig.CheckServer(root); err != nil {
			return nil, fmt.Errorf("kubernetes.k8s_api_root: %w", err)
		}
		kc.Server = root
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: kc.InsecureSkipTLSVerify} //nolint:gosec // the kubeconfig's own choice
	if !kc.InsecureSkipTLSVerify {
		tlsConf.RootCAs = x509.NewCertPool()
		if !tlsConf.RootCAs.AppendCertsFromPEM(kc.CA) {
			return nil, fmt.Errorf("kubeconfig %s: the certificate authority holds no PEM certificate", path)
		}
	}
	return &kubeClient{
		http: &http.Client{Timeout: conf.APITimeout(), Transport: &http.Transport{
			TLSClientConfig: tlsConf, Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true}},
		server: kc.Server, token: kc.Token,
		what: fmt.Sprintf("the Kubernetes API at %s (kubeconfig %s, context %s)", kc.Server, path, kubeconfig.Context),
	}, nil
}

func (k *kubeClient) Pod(ctx context.Context, namespace, name string) (*Pod, error) {
	return get[Pod](ctx, k, "get pod "+namespace+"/"+name, "/api/v1/namespaces/"+url.PathEscape(namespace)+"/pods/"+url.PathEscape(name))
}

func (k *kubeClient) Namespace(ctx context.Context, name string) (*Namespace, error) {
	return get[Namespace](ctx, k, "get namespace "+name, "/api/v1/namespaces/"+url.PathEscape(name))
}

func (k *kubeClient) Service(ctx context.Context, namespace, name string) (*Service, error) {
	return get[Service](ctx, k, "get service "+namespace+"/"+name, "/api/v1/namespaces/"+url.PathEscape(namespace)+"/services/"+url.PathEscape(name))
}

// statusError is the API server's answer to a request it refused: a metav1.Status.
type statusError struct {
	Code    int    `json:"code"`
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

func (e *statusError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("HTTP %d", e.Code)
	}
	return fmt.Sprintf("HTTP %d %s: %s", e.Code, e.Reason, e.Message)
}

// get reads one object, from the API server's watch cache (resourceVersion 0), which saves a round
// trip to etcd (docs/performance.md): the cache trails etcd by milliseconds, and the objects exist
// well before the pod's sandbox does. An object the cache has not seen yet is read from etcd.
func get[T any](ctx context.Context, k *kubeClient, what, path string) (*T, error) {
	body, err := k.do(ctx, path+"?resourceVersion=0")
	var se *statusError
	if errors.As(err, &se) && se.Code == http.StatusNotFound {
		body, err = k.do(ctx, path)
	}
	if err != nil {
		return nil, k.explain(ctx, what, err)
	}
	var v T
	if err := json.Unmarshal(body, &v); err != nil {
		return nil, fmt.Errorf("%s: decode the answer of %s: %w", what, k.server, err)
	}
	return &v, nil
}

func (k *kubeClient) do(ctx context.Context, pathQuery string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.server+pathQuery, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+k.token)
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "linkerd-cni/"+buildinfo.Version)
	resp, err := k.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxObject))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		se := &statusError{}
		_ = json.Unmarshal(body, se)
		se.Code = resp.StatusCode
		return nil, se
	}
	return body, nil
}

// explain turns a failed request into a message an operator can act on, wrapping err.
func (k *kubeClient) explain(ctx context.Context, what string, err error) error {
	var se *statusError
	var ne net.Error
	code := 0
	if errors.As(err, &se) {
		code = se.Code
	}
	switch {
	case code == http.StatusUnauthorized:
		return fmt.Errorf("%s: unauthorized: %s rejected the credentials; the token may be revoked or expired: %w", what, k.what, err)
	case code == http.StatusForbidden:
		return fmt.Errorf("%s: forbidden: %s denies the linkerd-cni user; check its ClusterRole: %w", what, k.what, err)
	case code == http.StatusNotFound:
		return fmt.Errorf("%s: not found in %s: %w", what, k.what, err)
	case code == http.StatusGatewayTimeout, se != nil && (se.Reason == "Timeout" || se.Reason == "ServerTimeout"),
		errors.Is(err, context.DeadlineExceeded), errors.Is(ctx.Err(), context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("%s: timed out waiting for %s: %w", what, k.what, err)
	}
	return fmt.Errorf("%s: %s is unreachable or failed: %w", what, k.what, err)
}
