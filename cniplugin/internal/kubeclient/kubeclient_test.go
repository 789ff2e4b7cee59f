package kubeclient

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

// Each call's request is the one client-go's typed clients send (the agent, installer and repair
// tests run them against a real kube-apiserver); this fast test pins the paths, the protobuf
// preference and the decoding, an API error's included, which the callers' apierrors checks need.
func TestRequests(t *testing.T) {
	ctx := context.Background()
	pod := `{"kind":"Pod","apiVersion":"v1","metadata":{"name":"web"}}`
	tests := []struct {
		name       string
		call       func(*Client) (runtime.Object, error)
		wantMethod string
		wantURL    string // path and query
		wantBody   string // a fragment (bodies are protobuf, but for patches)
		status     int
		reply      string
		wantName   string
	}{
		{"get a pod", func(k *Client) (runtime.Object, error) { return k.Pods("app").Get(ctx, "web", metav1.GetOptions{}) },
			http.MethodGet, "/api/v1/namespaces/app/pods/web", "", 200, pod, "web"},
		{"list a node's pods", func(k *Client) (runtime.Object, error) {
			return k.Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("spec.nodeName", "n1").String()})
		}, http.MethodGet, "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1", "", 200,
			`{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[` + pod + `]}`, ""},
		{"delete a pod", func(k *Client) (runtime.Object, error) {
			uid := types.UID("u1")
			return nil, k.Pods("app").Delete(ctx, "web", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		}, http.MethodDelete, "/api/v1/namespaces/app/pods/web", "u1", 200, `{"kind":"Status","apiVersion":"v1","status":"Success"}`, ""},
		{"patch a node", func(k *Client) (runtime.Object, error) {
			return k.Nodes().Patch(ctx, "n1", types.MergePatchType, []byte(`{"spec":{"taints":null}}`), metav1.PatchOptions{FieldManager: "linkerd-cni"})
		}, http.MethodPatch, "/api/v1/nodes/n1?fieldManager=linkerd-cni", `{"spec":{"taints":null}}`, 200,
			`{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"}}`, "n1"},
		{"get a DaemonSet", func(k *Client) (runtime.Object, error) {
			return k.DaemonSets("linkerd-cni").Get(ctx, "linkerd-cni", metav1.GetOptions{})
		}, http.MethodGet, "/apis/apps/v1/namespaces/linkerd-cni/daemonsets/linkerd-cni", "", 200,
			`{"kind":"DaemonSet","apiVersion":"apps/v1","metadata":{"name":"linkerd-cni"}}`, "linkerd-cni"},
		{"create an Event", func(k *Client) (runtime.Object, error) {
			return k.Events("app").Create(ctx, &eventsv1.Event{ObjectMeta: metav1.ObjectMeta{Name: "web.1"}, Reason: "RedirectRepaired"}, metav1.CreateOptions{})
		}, http.MethodPost, "/apis/events.k8s.io/v1/namespaces/app/events", "RedirectRepaired", 201,
			`{"kind":"Event","apiVersion":"events.k8s.io/v1","metadata":{"name":"web.1"}}`, "web.1"},
		{"a pod not found", func(k *Client) (runtime.Object, error) { return k.Pods("app").Get(ctx, "gone", metav1.GetOptions{}) },
			http.MethodGet, "/api/v1/namespaces/app/pods/gone", "", 404,
			`{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404,"message":"pods \"gone\" not found"}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var method, url, accept, body string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				method, url, accept, body = r.Method, r.URL.RequestURI(), r.Header.Get("Accept"), string(b)
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(tt.status)
				io.WriteString(w, tt.reply)
			}))
			defer srv.Close()
			k, err := New(&rest.Config{Host: srv.URL})
			if err != nil {
				t.Fatal(err)
			}
			obj, err := tt.call(k)
			if method != tt.wantMethod || url != tt.wantURL || !strings.Contains(body, tt.wantBody) {
				t.Errorf("request %s %s %s, want %s %s with %s", method, url, body, tt.wantMethod, tt.wantURL, tt.wantBody)
			}
			if want := "application/vnd.kubernetes.protobuf,application/json"; accept != want {
				t.Errorf("Accept %q, want %q", accept, want)
			}
			if tt.status == 404 {
				if !apierrors.IsNotFound(err) {
					t.Errorf("error %v, want a NotFound API error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if m, ok := obj.(metav1.Object); ok && m.GetName() != tt.wantName {
				t.Errorf("decoded %q, want %q", m.GetName(), tt.wantName)
			}
		})
	}
}
