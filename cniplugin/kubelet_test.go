package cniplugin

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8stypes "k8s.io/apimachinery/pkg/types"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"

	"github.com/kubemesh/proxy-init/test/kubelettest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// The plugin's client of the kubelet's pods API (kubelet.go, kubeletproto.go) against the real
// generated types: the kubelet's v1alpha1 messages and k8s.io/api's protobuf of a Pod, served by
// grpc-go, and against a raw HTTP/2 server for what a real one does not send.

// realPod is a core/v1 Pod with the fields the plugin reads and many it skips (every wire type
// among them), as the kubelet holds it.
func realPod(name, uid string, annotations map[string]string) *corev1.Pod {
	always := corev1.ContainerRestartPolicyAlways
	now := metav1.NewTime(time.Unix(1_800_000_000, 5))
	grace := int64(30)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "web", UID: k8stypes.UID("u-" + uid), ResourceVersion: "41", Generation: 3,
			CreationTimestamp: now, DeletionGracePeriodSeconds: &grace, GenerateName: "api-",
			Labels: map[string]string{"app": "api", LabelControlPlaneComponent: "destination"}, Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "api-7d9f", UID: "rs-1"}},
			Finalizers:      []string{"example.com/keep"},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kubectl", Operation: metav1.ManagedFieldsOperationApply, Time: &now}}},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "linkerd-proxy", Image: "proxy", RestartPolicy: &always,
				Ports: []corev1.ContainerPort{{Name: "admin", ContainerPort: 4191}}}},
			Containers: []corev1.Container{{Name: "app", Image: "app", Command: []string{"/app"},
				Resources: corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m")}},
				Env:       []corev1.EnvVar{{Name: "A", Value: "b"}}}},
			TerminationGracePeriodSeconds: &grace, NodeName: "node-1", HostNetwork: false, Priority: new(int32),
		},
		Status: corev1.PodStatus{Phase: corev1.PodPending, PodIPs: []corev1.PodIP{{IP: "192.0.2.7"}}},
	}
}

// wantPod is realPod as the plugin reads it.
func wantPod(name string, annotations map[string]string) *Pod {
	return &Pod{
		ObjectMeta: ObjectMeta{Name: name, Namespace: "web", Labels: map[string]string{"app": "api", LabelControlPlaneComponent: "destination"}, Annotations: annotations},
		Spec: PodSpec{InitContainers: []Container{{Name: "linkerd-proxy", RestartPolicy: "Always"}},
			Containers: []Container{{Name: "app"}}},
	}
}

func marshalPod(t testing.TB, p *corev1.Pod) []byte {
	t.Helper()
	b, err := p.Marshal() // what the kubelet puts in its answers
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDecodeKubeletAnswers decodes the kubelet's real messages, marshalled by its generated code.
func TestDecodeKubeletAnswers(t *testing.T) {
	annotations := map[string]string{AnnotationSkipOutboundPorts: "3306", "example.com/empty": ""}
	raw := marshalPod(t, realPod("api-0", "1", annotations))
	resp, err := proto.Marshal(&podsv1alpha1.GetPodResponse{Pod: raw})
	if err != nil {
		t.Fatal(err)
	}
	b, err := getPodResponse(resp)
	if err != nil {
		t.Fatal(err)
	}
	p, err := decodePod(b)
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(wantPod("api-0", annotations), &p.Pod); d != "" {
		t.Errorf("pod (-want +got):\n%s", d)
	}
	if p.uid != "u-1" || p.deleting {
		t.Errorf("uid %q deleting %v, want u-1 false", p.uid, p.deleting)
	}
	if Classify(&p.Spec) != KindNativeSidecar || !IsControlPlane(p.Labels) {
		t.Errorf("kind %s, control plane %v", Classify(&p.Spec), IsControlPlane(p.Labels))
	}

	deleting := realPod("api-0", "0", nil)
	now := metav1.Now()
	deleting.DeletionTimestamp = &now
	list, err := proto.Marshal(&podsv1alpha1.ListPodsResponse{Pods: [][]byte{marshalPod(t, deleting), marshalPod(t, realPod("api-1", "2", nil))}})
	if err != nil {
		t.Fatal(err)
	}
	var got []*kubeletPod
	if err := eachPodOfList(list, func(_ int, b []byte) error {
		p, err := decodePod(b)
		got = append(got, p)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].uid != "u-0" || !got[0].deleting || got[1].Name != "api-1" || got[1].deleting {
		t.Errorf("list: %+v", got)
	}

	// The request: the generated code reads what the plugin writes.
	var req podsv1alpha1.GetPodRequest
	if err := proto.Unmarshal(protoString(nil, 1, "u-1"), &req); err != nil || req.PodUID != "u-1" {
		t.Errorf("GetPodRequest %v: %v", &req, err)
	}
}

// TestDecodeKubeletBadInput: what does not decode whole is refused, naming the field.
func TestDecodeKubeletBadInput(t *testing.T) {
	good := marshalPod(t, realPod("api-0", "1", map[string]string{AnnotationSkipOutboundPorts: "3306"}))
	for _, tc := range []struct {
		name string
		msg  []byte
		want string
	}{
		{"empty answer", nil, "GetPodResponse.pod: absent"},
		{"pod of the wrong wire type", []byte{0x08, 0x01}, "GetPodResponse.pod: wire type 0, want 2 (length-delimited)"},
		{"pod past the end", []byte{0x0a, 0x05, 'a'}, "GetPodResponse.pod: length 5, past the end of the message (1 bytes left)"},
		{"truncated pod", protoBytes(1, good[:len(good)/2]), "Pod.metadata: length 245, past the end of the message (229 bytes left)"},
		{"bad tag", []byte{0x80}, "GetPodResponse: a field's tag is not a varint"},
		{"group", []byte{0x0b}, "GetPodResponse.pod: wire type 3, want 2 (length-delimited)"},
		{"unknown field's group", []byte{0x1b}, "GetPodResponse.field 3: wire type 3 is not supported"},
		{"field 0", []byte{0x02, 0x00}, "GetPodResponse: field number 0"},
		{"name as a varint", protoBytes(1, protoBytes(1, []byte{0x08, 0x01})), "Pod.metadata: ObjectMeta.name: wire type 0, want 2 (length-delimited)"},
		{"annotation past the end", protoBytes(1, protoBytes(1, protoBytes(12, []byte{0x0a, 0x09, 'k'}))),
			"Pod.metadata: ObjectMeta.annotations: entry.key: length 9, past the end of the message (1 bytes left)"},
		{"fixed64 cut short", protoBytes(1, protoBytes(2, protoBytes(2, []byte{0x19, 1, 2}))),
			"Pod.spec: PodSpec.containers: Container.field 3: 2 bytes left, want 8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := getPodResponse(tc.msg)
			if err == nil {
				_, err = decodePod(b)
			}
			if err == nil || err.Error() != tc.want {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
}

func protoBytes(num uint64, v []byte) []byte { return protoString(nil, num, string(v)) }

// socketDir is a directory for a socket the plugin accepts: root's, in a short path.
func socketDir(t *testing.T) string {
	nt.RequireRoot(t, "the plugin talks only to a socket root owns")
	dir, err := os.MkdirTemp("", "kubelet-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// startFakeKubelet serves pods from a kubelet on a socket the plugin accepts.
func startFakeKubelet(t *testing.T, pods ...*corev1.Pod) *kubelettest.Kubelet {
	return serveKubelet(t, kubelettest.New(pods...))
}

func serveKubelet(t *testing.T, k *kubelettest.Kubelet) *kubelettest.Kubelet {
	return k.Serve(t, filepath.Join(socketDir(t), "pods-api.sock"))
}

// TestKubeletClientAgainstGRPC: the plugin's client against grpc-go serving the kubelet's service.
func TestKubeletClientAgainstGRPC(t *testing.T) {
	annotations := map[string]string{AnnotationSkipOutboundPorts: "3306"}
	deleting := realPod("api-0", "0", nil)
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	f := startFakeKubelet(t, deleting, realPod("api-0", "1", annotations), realPod("api-1", "2", nil))
	k := newKubeletClient(f.Socket)
	defer k.close()
	ctx := t.Context()

	p, err := k.pod(ctx, "web", "api-0", "u-1")
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(wantPod("api-0", annotations), p); d != "" {
		t.Errorf("GetPod (-want +got):\n%s", d)
	}
	// Without a UID, by name: of two incarnations, the one not being deleted.
	if p, err = k.pod(ctx, "web", "api-0", ""); err != nil || p.Annotations[AnnotationSkipOutboundPorts] != "3306" {
		t.Errorf("ListPods: %+v, %v", p, err)
	}
	prefix := "the kubelet's pods API at " + f.Socket + ": "
	for _, tc := range []struct {
		name, ns, pod, uid string
		err                error
		want               string
	}{
		{"another pod's UID", "web", "api-0", "u-2", nil, prefix + "asked for web/api-0 (uid u-2), got web/api-1 (uid u-2): the kubelet did not give the pod"},
		{"not on the node", "web", "api-9", "", nil, prefix + "pod web/api-9 is not among the node's pods: the kubelet did not give the pod"},
		{"not found", "web", "api-9", "u-9", nil, prefix + "/v1alpha1.Pods/GetPod: gRPC status NotFound: pod u-9 not found"},
		{"rate-limited", "web", "api-0", "u-1", status.Error(codes.ResourceExhausted, "rejected by rate limit: 100% used"),
			prefix + "/v1alpha1.Pods/GetPod: gRPC status ResourceExhausted: rejected by rate limit: 100% used"},
		{"not served", "web", "api-0", "", status.Error(codes.Unimplemented, "unknown method ListPods"),
			prefix + "/v1alpha1.Pods/ListPods: gRPC status Unimplemented: unknown method ListPods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f.Failing(tc.err)
			defer f.Failing(nil)
			if _, err := k.pod(ctx, tc.ns, tc.pod, tc.uid); err == nil || err.Error() != tc.want {
				t.Errorf("error %v,\nwant %s", err, tc.want)
			}
		})
	}

	// A pod larger than the plugin reads.
	big := realPod("api-0", "1", map[string]string{"example.com/big": strings.Repeat("x", maxKubeletPod)})
	f.Set(big)
	if _, err := k.pod(ctx, "web", "api-0", "u-1"); err == nil || !strings.HasPrefix(err.Error(), prefix+"/v1alpha1.Pods/GetPod: the answer's message is ") ||
		!strings.HasSuffix(err.Error(), " bytes, more than the 8388608 read") {
		t.Errorf("an oversized pod: %v", err)
	}
	want := []string{"GetPod u-1", "ListPods", "GetPod u-2", "ListPods", "GetPod u-9", "GetPod u-1", "ListPods", "GetPod u-1"}
	if d := cmp.Diff(want, f.Calls()); d != "" {
		t.Errorf("calls (-want +got):\n%s", d)
	}
}

// rawKubelet serves the kubelet's socket with handler, over unencrypted HTTP/2.
func rawKubelet(t *testing.T, handler http.HandlerFunc) string {
	socket := filepath.Join(socketDir(t), "pods-api.sock")
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: handler, Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return socket
}

// frame is a gRPC message: flag, length, then body (which may be shorter than the length).
func frame(flag byte, length int, body []byte) []byte {
	b := []byte{flag, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(b[1:], uint32(length))
	return append(b, body...)
}

// TestKubeletClientBadAnswers: what a real server does not send is refused, with the exact reason.
func TestKubeletClientBadAnswers(t *testing.T) {
	pod := marshalPod(t, realPod("api-0", "1", nil))
	ok, _ := proto.Marshal(&podsv1alpha1.GetPodResponse{Pod: pod})
	for _, tc := range []struct {
		name    string
		status  int
		ct      string
		body    []byte
		trailer map[string]string // set after the body
		header  map[string]string // set before it
		want    string
	}{
		{"the answer", 200, "application/grpc", frame(0, len(ok), ok), map[string]string{"Grpc-Status": "0"}, nil, ""},
		{"truncated message", 200, "application/grpc", frame(0, 100, ok[:10]), map[string]string{"Grpc-Status": "0"}, nil,
			"the answer's message of 100 bytes: unexpected EOF"},
		{"truncated header", 200, "application/grpc", []byte{0, 0}, map[string]string{"Grpc-Status": "0"}, nil,
			"the answer's message header: unexpected EOF"},
		{"oversized message", 200, "application/grpc", frame(0, maxKubeletPod+1, nil), nil, nil,
			"the answer's message is 8388609 bytes, more than the 8388608 read"},
		{"compressed", 200, "application/grpc", frame(1, len(ok), ok), map[string]string{"Grpc-Status": "0"}, nil,
			"the answer's message is compressed (flag 1); none was asked for"},
		{"two messages", 200, "application/grpc", append(frame(0, len(ok), ok), frame(0, len(ok), ok)...), map[string]string{"Grpc-Status": "0"}, nil,
			"after the answer's message: more than one message"},
		{"no status", 200, "application/grpc", frame(0, len(ok), ok), nil, nil, "the answer has no grpc-status trailer"},
		{"status after a message", 200, "application/grpc", frame(0, len(ok), ok), map[string]string{"Grpc-Status": "13", "Grpc-Message": "out%20of%20memory"}, nil,
			"gRPC status Internal: out of memory"},
		{"status without a message", 200, "application/grpc", nil, map[string]string{"Grpc-Status": "14", "Grpc-Message": "restarting"}, nil,
			"gRPC status Unavailable: restarting"},
		{"status only, in the headers", 200, "application/grpc", nil, nil, map[string]string{"Grpc-Status": "7", "Grpc-Message": "not%20root"},
			"gRPC status PermissionDenied: not root"},
		{"OK and no message", 200, "application/grpc", nil, nil, map[string]string{"Grpc-Status": "0"}, "grpc-status OK and no message"},
		{"a status beyond gRPC's", 200, "application/grpc", nil, nil, map[string]string{"Grpc-Status": "99"}, "gRPC status code 99"},
		{"a status that is no number", 200, "application/grpc", nil, nil, map[string]string{"Grpc-Status": "bad"}, `grpc-status "bad" is not a number`},
		{"HTTP error", 503, "text/plain", []byte("busy"), nil, nil, "HTTP status 503, want 200"},
		{"not gRPC", 200, "text/html", []byte("<html>"), nil, nil, `content-type "text/html", want application/grpc`},
		{"a message that is not the answer", 200, "application/grpc", frame(0, 3, []byte{0x0a, 0x05, 'a'}), map[string]string{"Grpc-Status": "0"}, nil,
			"GetPodResponse.pod: length 5, past the end of the message (1 bytes left)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got *http.Request
			socket := rawKubelet(t, func(w http.ResponseWriter, r *http.Request) {
				got = r
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.Header().Set("Content-Type", tc.ct)
				w.WriteHeader(tc.status)
				_, _ = w.Write(tc.body)
				for k, v := range tc.trailer {
					w.Header().Set(http.TrailerPrefix+k, v)
				}
			})
			k := newKubeletClient(socket)
			defer k.close()
			p, err := k.pod(t.Context(), "web", "api-0", "u-1")
			if tc.want == "" {
				if err != nil || p.Name != "api-0" {
					t.Fatalf("pod %+v, %v", p, err)
				}
				if got.Method != "POST" || got.URL.Path != "/v1alpha1.Pods/GetPod" || got.ProtoMajor != 2 ||
					got.Header.Get("Content-Type") != "application/grpc" || got.Header.Get("Te") != "trailers" {
					t.Errorf("request %s %s %s, headers %v", got.Method, got.URL.Path, got.Proto, got.Header)
				}
				return
			}
			want := "the kubelet's pods API at " + socket + ": /v1alpha1.Pods/GetPod: " + tc.want
			if err == nil || err.Error() != want {
				t.Errorf("error %v,\nwant %s", err, want)
			}
			if p != nil {
				t.Errorf("a pod from a bad answer: %+v", p)
			}
		})
	}
}

// kubeletArgs is the node rig's call with kubernetes.kubelet-pods-socket (absent when socket is
// "-") and no node agent on the node.
func kubeletArgs(t *testing.T, r *policyRig, socket string) *skel.CmdArgs {
	args := r.args(t)
	var conf map[string]any
	if err := json.Unmarshal(args.StdinData, &conf); err != nil {
		t.Fatal(err)
	}
	if socket != "-" {
		conf["kubernetes"].(map[string]any)["kubelet-pods-socket"] = socket
	}
	conf["agent"] = map[string]any{"socket": filepath.Join(t.TempDir(), "absent.sock")}
	args.StdinData = mustJSONBytes(t, conf)
	return args
}

// TestPluginReadsTheKubelet: the node's plugin without an agent reads the pod from the kubelet:
// a pod carrying every annotation with no API request, one that needs its namespace with one (and
// fails closed, error 11 and nothing written, when the API does not answer it); when the kubelet
// does not give the pod, the plugin reads the API, saying why above debug only when something is
// wrong.
func TestPluginReadsTheKubelet(t *testing.T) {
	every := map[string]string{}
	for _, a := range Annotations {
		every[a] = "1"
	}
	every[AnnotationSkipOutboundPorts] = "3306"
	every[AnnotationSkipSubnets], every[AnnotationSkipInboundSubnets], every[AnnotationSkipOutboundSubnets] = "192.0.2.0/24", "203.0.113.0/24", "198.51.100.0/24"
	meshed := func(uid string, annotations map[string]string) *corev1.Pod {
		p := realPod("api-0", uid, annotations)
		p.Labels = nil
		p.Spec.InitContainers = nil
		p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "linkerd-proxy"})
		return p
	}

	t.Run("every annotation on the pod", func(t *testing.T) {
		f := startFakeKubelet(t, meshed("1", every))
		r := nodeRig(t, nil)
		args := kubeletArgs(t, r, f.Socket)
		args.Args += ";K8S_POD_UID=u-1"
		if err := r.plugin.Add(args); err != nil {
			t.Fatalf("ADD: %v\n%s", err, r.logs.String())
		}
		if len(r.api.requests) != 0 {
			t.Errorf("API lookups %v, want none", r.api.requests)
		}
		if d := r.fake.Dump(); !strings.Contains(d, "3306") {
			t.Errorf("the pod's annotation from the kubelet was not applied:\n%s", d)
		}
		if l := r.logs.String(); !strings.Contains(l, "source=kubelet api_requests=0") || strings.Contains(l, "level=WARN") {
			t.Errorf("log:\n%s", l)
		}
		if c := f.Calls(); len(c) != 1 || c[0] != "GetPod u-1" {
			t.Errorf("kubelet calls %v, want GetPod u-1", c)
		}
		// CHECK reads it the same way.
		if err := r.plugin.Check(args); err != nil || len(r.api.requests) != 0 {
			t.Errorf("CHECK: %v, API lookups %v", err, r.api.requests)
		}
	})
	t.Run("a pod that needs its namespace", func(t *testing.T) {
		f := startFakeKubelet(t, meshed("1", nil))
		r := nodeRig(t, nil)
		r.api.ns = &Namespace{ObjectMeta: ObjectMeta{Name: "web", Annotations: map[string]string{AnnotationSkipOutboundPorts: "5432"}}}
		if err := r.plugin.Add(kubeletArgs(t, r, f.Socket)); err != nil {
			t.Fatalf("ADD: %v\n%s", err, r.logs.String())
		}
		if d := cmp.Diff([]string{"namespace web"}, r.api.requests); d != "" {
			t.Errorf("API lookups (-want +got):\n%s", d)
		}
		if d := r.fake.Dump(); !strings.Contains(d, "5432") {
			t.Errorf("the namespace's annotation was not applied:\n%s", d)
		}
		if l := r.logs.String(); !strings.Contains(l, "source=kubelet api_requests=1") {
			t.Errorf("log:\n%s", l)
		}
		if c := f.Calls(); len(c) != 1 || c[0] != "ListPods" {
			t.Errorf("kubelet calls %v, want ListPods (no K8S_POD_UID)", c)
		}
	})
	t.Run("its namespace unreadable", func(t *testing.T) {
		f := startFakeKubelet(t, meshed("1", nil))
		r := nodeRig(t, nil)
		r.api.ns, r.api.err = nil, errors.New("connection refused")
		code, msg := cniCode(t, r.plugin.Add(kubeletArgs(t, r, f.Socket)))
		want := "meshed pod web/api-0: its namespace's annotations cannot be read (timeout 10s): the pod came from the kubelet, namespace web needs the API: connection refused"
		if code != types.ErrTryAgainLater || msg != want {
			t.Errorf("ADD: code %d %q,\nwant %d %q", code, msg, types.ErrTryAgainLater, want)
		}
		if d := r.fake.Dump(); strings.Contains(d, "PROXY_INIT") || r.out.Len() != 0 {
			t.Errorf("a pod whose settings are unknown got rules or a result:\n%s\n%s", d, r.out.String())
		}
	})
	t.Run("a control-plane pod", func(t *testing.T) {
		cp := meshed("1", every)
		cp.Labels = map[string]string{LabelControlPlaneComponent: "destination"}
		f := startFakeKubelet(t, cp)
		r := nodeRig(t, nil)
		r.api.svc = &Service{Spec: ServiceSpec{Ports: []ServicePort{{Port: 443, TargetPort: TargetPort{Number: 16443}}}}}
		if err := r.plugin.Add(kubeletArgs(t, r, f.Socket)); err != nil {
			t.Fatalf("ADD: %v\n%s", err, r.logs.String())
		}
		if d := cmp.Diff([]string{"service default/kubernetes"}, r.api.requests); d != "" {
			t.Errorf("API lookups (-want +got):\n%s", d)
		}
		if d := r.fake.Dump(); !strings.Contains(d, "16443") {
			t.Errorf("the API server's port was not skipped:\n%s", d)
		}
	})

	const warn = `level=WARN msg="the kubelet did not give the pod; reading it from the API"`
	dir := socketDir(t)
	file := filepath.Join(dir, "file.sock")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, socket string
		kubelet      *kubelettest.Kubelet
		log          string // "" for nothing above debug
	}{
		{"no kubelet socket", filepath.Join(dir, "absent.sock"), nil, ""},
		{"the key off", "", nil, ""},
		{"the default path", "-", nil, ""}, // no kubelet on the test machine, or it does not know web/api-0
		{"not a socket", file, nil, `socket=` + file + ` error="` + file + ` is not a socket (mode -rw-------)"`},
		{"the kubelet refuses", "", kubelettest.New(meshed("1", nil)).Failing(status.Error(codes.Unavailable, "shutting down")),
			"%s/v1alpha1.Pods/ListPods: gRPC status Unavailable: shutting down"},
		{"another pod", "", kubelettest.New(realPod("api-5", "5", nil)),
			"%spod web/api-0 is not among the node's pods: the kubelet did not give the pod"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			socket := tc.socket
			if tc.kubelet != nil {
				socket = serveKubelet(t, tc.kubelet).Socket
				tc.log = fmt.Sprintf(tc.log, `socket=`+socket+` error="the kubelet's pods API at `+socket+`: `)
			}
			if tc.socket == "-" {
				if _, err := os.Stat(DefaultKubeletPodsSocket); err == nil {
					t.Skip("this machine runs a kubelet")
				}
			}
			r := nodeRig(t, meshedPod(nil, nil))
			if err := r.plugin.Add(kubeletArgs(t, r, socket)); err != nil {
				t.Fatalf("ADD: %v\n%s", err, r.logs.String())
			}
			if d := cmp.Diff([]string{"pod web/api-0", "namespace web"}, r.api.requests); d != "" {
				t.Errorf("API lookups (-want +got):\n%s", d)
			}
			logs := r.logs.String()
			switch {
			case !strings.Contains(logs, "source=api api_requests=2"):
				t.Errorf("log does not say the pod came from the API:\n%s", logs)
			case tc.log == "" && strings.Contains(logs, "kubelet"):
				t.Errorf("logs about the kubelet above debug:\n%s", logs)
			case tc.log != "" && (!strings.Contains(logs, warn) || !strings.Contains(logs, tc.log)):
				t.Errorf("log lacks %s with %s:\n%s", warn, tc.log, logs)
			}
		})
	}
}

// FuzzDecodeKubeletPod: the decoder never panics on what a socket may send, and whatever both it
// and the generated code (k8s.io/api's Unmarshal, the kubelet's own reader) accept, they read alike.
func FuzzDecodeKubeletPod(f *testing.F) {
	f.Add(marshalPod(f, realPod("api-0", "1", map[string]string{AnnotationSkipOutboundPorts: "3306"})))
	f.Add([]byte{0x0a, 0x05, 'a'})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := decodePod(b)
		var want corev1.Pod
		if err != nil || want.Unmarshal(b) != nil {
			return
		}
		if got.Name != want.Name || got.Namespace != want.Namespace || got.uid != string(want.UID) || got.deleting != (want.DeletionTimestamp != nil) ||
			!equalMaps(got.Labels, want.Labels) || !equalMaps(got.Annotations, want.Annotations) ||
			!sameContainers(got.Spec.InitContainers, want.Spec.InitContainers) || !sameContainers(got.Spec.Containers, want.Spec.Containers) {
			t.Fatalf("%x: decoded %+v, the generated code %+v", b, got, &want)
		}
	})
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func sameContainers(got []Container, want []corev1.Container) bool {
	if len(got) != len(want) {
		return false
	}
	for i, c := range want {
		policy := ""
		if c.RestartPolicy != nil {
			policy = string(*c.RestartPolicy)
		}
		if got[i].Name != c.Name || got[i].RestartPolicy != policy {
			return false
		}
	}
	return true
}
