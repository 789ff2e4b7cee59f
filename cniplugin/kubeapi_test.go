package cniplugin

import (
	"bytes"
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubemesh/proxy-init/internal/buildinfo"
	"github.com/kubemesh/proxy-init/internal/kubeconfig"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// kubeconfigWith is a kubeconfig of the installer's shape with these user and cluster entries
// ("": the installer's, for server).
func kubeconfigWith(server, user, cluster string) string {
	if cluster == "" {
		cluster = `"server":"` + server + `","insecure-skip-tls-verify":true`
	}
	if user == "" {
		user = `"token":"abc"`
	}
	return `{"apiVersion":"v1","kind":"Config","current-context":"linkerd-cni-context",
 "clusters":[{"name":"local","cluster":{` + cluster + `}}],
 "users":[{"name":"linkerd-cni","user":{` + user + `}}],
 "contexts":[{"name":"linkerd-cni-context","context":{"cluster":"local","user":"linkerd-cni"}}]}`
}

// TestKubeconfigRefused: a kubeconfig asking for what the plugin's client does not do is refused
// before any request, naming the file and the field: ADD fails with "try again later" (the pod
// might be meshed), writing nothing in the pod's namespace, and STATUS reports the plugin not
// available.
func TestKubeconfigRefused(t *testing.T) {
	const server = "https://192.0.2.1:6443"
	tests := []struct {
		name, content, want string
	}{
		{"exec", kubeconfigWith(server, `"exec":{"command":"aws","apiVersion":"client.authentication.k8s.io/v1"}`, ""),
			"users[linkerd-cni].user.exec: a credential plugin is not run by the CNI plugin: use token or tokenFile"},
		{"auth-provider", kubeconfigWith(server, `"auth-provider":{"name":"gcp"}`, ""),
			"users[linkerd-cni].user.auth-provider: an auth provider is not run by the CNI plugin: use token or tokenFile"},
		{"client certificates", kubeconfigWith(server, `"client-certificate-data":"Y2VydA==","client-key-data":"a2V5"`, ""),
			"users[linkerd-cni].user.client-certificate-data: client certificates are not supported: use token or tokenFile"},
		{"basic authentication", kubeconfigWith(server, `"username":"admin","password":"secret"`, ""),
			"users[linkerd-cni].user.password: basic authentication is not supported: use token or tokenFile"},
		{"an http server", kubeconfigWith("", "", `"server":"http://192.0.2.1:8080","insecure-skip-tls-verify":true`),
			`clusters[local].cluster.server: "http://192.0.2.1:8080" is not an https URL: the token goes over TLS only`},
		{"an unknown field", kubeconfigWith(server, "", `"server":"`+server+`","insecure-skip-tls-verify":true,"proxy-url":"http://192.0.2.2:3128"`),
			`clusters[local].cluster: json: unknown field "proxy-url"`},
		{"YAML", "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: " + server + "\n",
			"not JSON: linkerd-cni install writes the plugin's kubeconfig as JSON, and the plugin reads no other form (YAML included)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := netnstest.NewNS(t)
			path := filepath.Join(t.TempDir(), "ZZZ-linkerd-cni-kubeconfig")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			conf := strings.Replace(linkerdChartConfig, "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig", path, 1)
			conf = strings.Replace(conf, `"log_level":"info",`, `"log_level":"info","agent":{"socket":""},`, 1)
			var out, logs bytes.Buffer
			p := NewNodePlugin()
			p.Stdout, p.Stderr = &out, &logs
			args := &skel.CmdArgs{ContainerID: "c1", Netns: n.Path(), IfName: "eth0",
				Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0", StdinData: withVersion(t, conf, "1.0.0")}
			code, msg := cniCode(t, p.Add(args))
			if want := "pod web/api-0 might be meshed and cannot be looked up: kubeconfig " + path + ": " + tt.want; code != types.ErrTryAgainLater || msg != want {
				t.Errorf("ADD: code %d\n%s\nwant %d\n%s", code, msg, types.ErrTryAgainLater, want)
			}
			if out.Len() != 0 {
				t.Errorf("ADD printed %q", out.String())
			}
			if rules, err := netnstest.RunIn(t, n, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(rules) != "" {
				t.Errorf("the pod's namespace holds rules (%v):\n%s", err, rules)
			}
			code, msg = cniCode(t, p.Status(&skel.CmdArgs{StdinData: withVersion(t, conf, "1.1.0")}))
			if want := "linkerd-cni cannot look pods up: kubeconfig " + path + ": " + tt.want; code != types.ErrPluginNotAvailable || msg != want {
				t.Errorf("STATUS: code %d\n%s\nwant %d\n%s", code, msg, types.ErrPluginNotAvailable, want)
			}
		})
	}
}

// TestKubeClient pins the client's requests against a TLS server standing in for the API server:
// the GET from the watch cache first (resourceVersion=0), then from etcd when the cache does not
// have the object, the token, JSON and the user agent; and the explanation of each failure,
// naming the API server and the kubeconfig.
func TestKubeClient(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.URL.RequestURI()+" "+r.Header.Get("Authorization")+" "+r.Header.Get("Accept")+" "+r.Header.Get("User-Agent"))
		mu.Unlock()
		switch {
		case r.URL.Path == "/api/v1/namespaces/web/pods/new" && r.URL.RawQuery == "resourceVersion=0":
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"kind":"Status","status":"Failure","reason":"NotFound","code":404,"message":"pods \"new\" not found"}`))
		case strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/web/pods/"):
			_, _ = w.Write([]byte(`{"metadata":{"name":"new","namespace":"web","annotations":{"a":"b"}},"spec":{"containers":[{"name":"linkerd-proxy"}]}}`))
		case r.URL.Path == "/api/v1/namespaces/revoked":
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"kind":"Status","status":"Failure","reason":"Unauthorized","code":401,"message":"Unauthorized"}`))
		case r.URL.Path == "/api/v1/namespaces/secret":
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"kind":"Status","reason":"Forbidden","code":403,"message":"namespaces \"secret\" is forbidden"}`))
		case r.URL.Path == "/api/v1/namespaces/slow":
			time.Sleep(time.Second)
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer srv.Close()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(path, kubeconfig.Render(kubeconfig.Params{Server: srv.URL, Token: "tok", CA: ca}), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := &NetConf{Kubernetes: Kubernetes{Kubeconfig: path, Timeout: 300 * time.Millisecond}}
	api, err := NewKubeClient(conf)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := api.Pod(context.Background(), "web", "new")
	if err != nil || pod.Name != "new" || pod.Annotations["a"] != "b" || Classify(&pod.Spec) != KindMeshed {
		t.Errorf("Pod = %+v, %v", pod, err)
	}
	ua := "linkerd-cni/" + buildinfo.Version
	want := []string{
		"/api/v1/namespaces/web/pods/new?resourceVersion=0 Bearer tok application/json " + ua,
		"/api/v1/namespaces/web/pods/new Bearer tok application/json " + ua,
	}
	mu.Lock()
	if strings.Join(seen, "\n") != strings.Join(want, "\n") {
		t.Errorf("requests:\n%s\nwant:\n%s", strings.Join(seen, "\n"), strings.Join(want, "\n"))
	}
	mu.Unlock()
	where := "the Kubernetes API at " + srv.URL + " (kubeconfig " + path + ", context linkerd-cni-context)"
	for ns, want := range map[string]string{
		"revoked": "get namespace revoked: unauthorized: " + where + " rejected the credentials; the token may be revoked or expired: HTTP 401 Unauthorized: Unauthorized",
		"secret":  "get namespace secret: forbidden: " + where + ` denies the linkerd-cni user; check its ClusterRole: HTTP 403 Forbidden: namespaces "secret" is forbidden`,
		"gone":    "get namespace gone: not found in " + where + ": HTTP 404",
		"slow":    "get namespace slow: timed out waiting for " + where + ": Get ",
	} {
		if _, err := api.Namespace(context.Background(), ns); err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("Namespace(%s) = %v\nwant %s...", ns, err, want)
		}
	}
	conf.Kubernetes.APIRoot = "http://192.0.2.1"
	if _, err := NewKubeClient(conf); err == nil || err.Error() != `kubernetes.k8s_api_root: "http://192.0.2.1" is not an https URL: the token goes over TLS only` {
		t.Errorf("an http k8s_api_root: %v", err)
	}
}
