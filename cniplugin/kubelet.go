package cniplugin

// The kubelet's pods API (KEP-4188; feature gate PodsAPI, on by default from Kubernetes 1.37),
// read when the node agent does not give the pod: the kubelet serves its node's pods over gRPC on
// a root-only UNIX socket (v1alpha1.Pods: GetPod by UID, ListPods), with neither the API server
// nor a token, so an API outage or a refused token does not hold up a pod.
//
// The plugin cannot link grpc-go, the protobuf runtime or k8s.io/api (TestPluginStaysLean), so
// this file speaks the little of gRPC a unary call needs over the standard library's HTTP/2
// client (h2c with prior knowledge), and kubeletproto.go decodes the few fields the plugin reads.
// Every length is bounded before anything is allocated for it.

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
	"github.com/kubemesh/proxy-init/internal/buildinfo"
)

// DefaultKubeletPodsSocket is the kubelet's pods API socket on a node whose kubelet runs with the
// default --root-dir, /var/lib/kubelet; kubernetes.kubelet-pods-socket names another.
const DefaultKubeletPodsSocket = "/var/lib/kubelet/pods-api/pods-api.sock"

// kubeletTimeout bounds the plugin's whole exchange with the kubelet, which answers from memory,
// on the node: past it the plugin reads the API.
const kubeletTimeout = time.Second

// The largest answers read: a pod is at most etcd's 1.5 MiB; a node holds at most a few hundred.
const (
	maxKubeletPod  = maxObject
	maxKubeletList = 64 << 20
)

// The kubelet's methods, as its api.proto declares them.
const (
	kubeletGetPod   = "/v1alpha1.Pods/GetPod"
	kubeletListPods = "/v1alpha1.Pods/ListPods"
)

// errKubeletNoPod marks an answer of the kubelet's that is not the pod asked about.
var errKubeletNoPod = errors.New("the kubelet did not give the pod")

type kubeletClient struct {
	path string
	http *http.Client
}

func newKubeletClient(path string) *kubeletClient {
	var dialer net.Dialer
	// No Proxy: the environment's is for the API server, never for a node-local socket.
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dialer.DialContext(ctx, "unix", path)
		},
		Protocols:          new(http.Protocols),
		DisableCompression: true,
	}
	tr.Protocols.SetUnencryptedHTTP2(true) // gRPC's h2c with prior knowledge; no HTTP/1.1
	return &kubeletClient{path: path, http: &http.Client{Transport: tr}}
}

func (k *kubeletClient) close() { k.http.CloseIdleConnections() }

// grpcCodes names gRPC's status codes (google.rpc.Code), for messages.
var grpcCodes = []string{"OK", "Canceled", "Unknown", "InvalidArgument", "DeadlineExceeded", "NotFound",
	"AlreadyExists", "PermissionDenied", "ResourceExhausted", "FailedPrecondition", "Aborted", "OutOfRange",
	"Unimplemented", "Internal", "Unavailable", "DataLoss", "Unauthenticated"}

// call makes one unary gRPC call: req is the request message's protobuf, the answer's is
// returned, at most lim bytes. Its errors name the socket and the method.
func (k *kubeletClient) call(ctx context.Context, method string, req []byte, lim int) (_ []byte, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("the kubelet's pods API at %s: %s: %w", k.path, method, err)
		}
	}()
	// A gRPC message: uncompressed (0), its length (4 bytes, big-endian), the protobuf.
	body := append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(req))), req...)
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://localhost"+method, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	hr.Header.Set("Content-Type", "application/grpc")
	hr.Header.Set("TE", "trailers")
	hr.Header.Set("User-Agent", "linkerd-cni/"+buildinfo.Version)
	resp, err := k.http.Do(hr)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP status %d, want 200", resp.StatusCode)
	}
	// A call that fails at once is answered with its status in the headers, and no message.
	if st := resp.Header.Get("Grpc-Status"); st != "" {
		err := grpcStatus(st, resp.Header.Get("Grpc-Message"))
		return nil, cmp.Or(err, errors.New("grpc-status OK and no message"))
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/grpc" && ct != "application/grpc+proto" {
		return nil, fmt.Errorf("content-type %q, want application/grpc", ct)
	}
	var head [5]byte
	if _, err := io.ReadFull(resp.Body, head[:]); err != nil {
		// No message: the status, in the trailers, says why.
		if st := resp.Trailer.Get("Grpc-Status"); err == io.EOF && st != "" && st != "0" {
			return nil, grpcStatus(st, resp.Trailer.Get("Grpc-Message"))
		}
		return nil, fmt.Errorf("the answer's message header: %w", unexpectedEOF(err))
	}
	if head[0] != 0 {
		return nil, fmt.Errorf("the answer's message is compressed (flag %d); none was asked for", head[0])
	}
	n := binary.BigEndian.Uint32(head[1:])
	if uint64(n) > uint64(lim) {
		return nil, fmt.Errorf("the answer's message is %d bytes, more than the %d read", n, lim)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(resp.Body, msg); err != nil {
		return nil, fmt.Errorf("the answer's message of %d bytes: %w", n, unexpectedEOF(err))
	}
	// A unary answer is one message, then the trailers.
	if _, err := io.ReadFull(resp.Body, head[:1]); err != io.EOF {
		err = cmp.Or(err, errors.New("more than one message"))
		return nil, fmt.Errorf("after the answer's message: %w", err)
	}
	st := resp.Trailer.Get("Grpc-Status")
	if st == "" {
		return nil, errors.New("the answer has no grpc-status trailer")
	}
	return msg, grpcStatus(st, resp.Trailer.Get("Grpc-Message"))
}

func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// grpcStatus is the call's outcome from its grpc-status and grpc-message (percent-encoded): nil
// for OK, else an error naming the status.
func grpcStatus(code, msg string) error {
	c, err := strconv.Atoi(code)
	if err != nil {
		return fmt.Errorf("grpc-status %q is not a number", code)
	}
	name := "code " + strconv.Itoa(c)
	switch {
	case c == 0:
		return nil
	case c > 0 && c < len(grpcCodes):
		name = grpcCodes[c]
	}
	if m, err := url.PathUnescape(msg); err == nil {
		msg = m
	}
	if msg == "" {
		return errors.New("gRPC status " + name)
	}
	return fmt.Errorf("gRPC status %s: %s", name, msg)
}

// kubeletPod is a pod as the kubelet gave it: what the plugin reads, and what tells it that the
// answer is the pod asked about.
type kubeletPod struct {
	Pod
	uid      string
	deleting bool // deletionTimestamp is set
}

// pod reads the pod namespace/name of the node: by uid when the runtime passed one (K8S_POD_UID),
// else by name among the node's pods. As with the agent's socket, it talks only to a socket root
// owns in a directory only root may write: the plugin acts on the answer as root.
func (k *kubeletClient) pod(ctx context.Context, namespace, name, uid string) (*Pod, error) {
	if err := wire.CheckSocket(k.path); err != nil {
		return nil, err
	}
	if uid == "" {
		return k.byName(ctx, namespace, name)
	}
	// GetPodRequest: podUID = 1.
	msg, err := k.call(ctx, kubeletGetPod, protoString(nil, 1, uid), maxKubeletPod)
	if err != nil {
		return nil, err
	}
	b, err := getPodResponse(msg)
	if err != nil {
		return nil, fmt.Errorf("the kubelet's pods API at %s: %s: %w", k.path, kubeletGetPod, err)
	}
	p, err := decodePod(b)
	if err != nil {
		return nil, fmt.Errorf("the kubelet's pods API at %s: %s: pod uid %s: %w", k.path, kubeletGetPod, uid, err)
	}
	if p.Namespace != namespace || p.Name != name || p.uid != uid {
		return nil, fmt.Errorf("the kubelet's pods API at %s: asked for %s/%s (uid %s), got %s/%s (uid %s): %w",
			k.path, namespace, name, uid, p.Namespace, p.Name, p.uid, errKubeletNoPod)
	}
	return &p.Pod, nil
}

func (k *kubeletClient) byName(ctx context.Context, namespace, name string) (*Pod, error) {
	msg, err := k.call(ctx, kubeletListPods, nil, maxKubeletList)
	if err != nil {
		return nil, err
	}
	var found *kubeletPod
	err = eachPodOfList(msg, func(i int, b []byte) error {
		p, err := decodePod(b)
		if err != nil {
			return fmt.Errorf("pod %d of the list: %w", i, err)
		}
		// Of two incarnations of one name, the one not being deleted is the one being set up.
		if p.Namespace == namespace && p.Name == name && (found == nil || found.deleting) {
			found = p
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("the kubelet's pods API at %s: %s: %w", k.path, kubeletListPods, err)
	}
	if found == nil {
		return nil, fmt.Errorf("the kubelet's pods API at %s: pod %s/%s is not among the node's pods: %w", k.path, namespace, name, errKubeletNoPod)
	}
	return &found.Pod, nil
}

// kubeletLookup serves a call's lookups with the pod the kubelet gave; its namespace and
// default/kubernetes, which the kubelet does not serve, come from the API server, read only when
// asked for.
type kubeletLookup struct {
	pod      *Pod
	api      func() (PodAPI, error) // sync.OnceValues: one client for both reads
	requests int
}

// APIRequests counts the lookups that went to the API server: the kubelet's are not.
func (k *kubeletLookup) APIRequests() int { return k.requests }

func (k *kubeletLookup) Pod(context.Context, string, string) (*Pod, error) { return k.pod, nil }

// Namespace is one API read. When it fails, so does the call (podRules' error 11): the pod came
// from the kubelet, but the annotations its namespace may give it cannot be known, and a pod is
// never set up with settings other than its own.
func (k *kubeletLookup) Namespace(ctx context.Context, name string) (*Namespace, error) {
	api, err := k.api()
	if err == nil {
		k.requests++
		var ns *Namespace
		if ns, err = api.Namespace(ctx, name); err == nil {
			return ns, nil
		}
	}
	return nil, fmt.Errorf("the pod came from the kubelet, namespace %s needs the API: %w", name, err)
}

func (k *kubeletLookup) Service(ctx context.Context, namespace, name string) (*Service, error) {
	api, err := k.api()
	if err != nil {
		return nil, err
	}
	k.requests++
	return api.Service(ctx, namespace, name)
}
