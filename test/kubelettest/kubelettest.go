// Package kubelettest serves the kubelet's pods API (k8s.io/kubelet's pods v1alpha1, the service
// behind the PodsAPI feature gate) with grpc-go on a UNIX socket, from pods a test sets: the
// kubelet's own service definition and Pod encoding, for the tests of the two clients of it, the
// node agent's and the plugin's. It counts calls, and can answer every call with one error.
package kubelettest

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"
)

// Kubelet answers GetPod and ListPods from its pods, each as v1.Pod's Marshal writes it.
type Kubelet struct {
	podsv1alpha1.UnimplementedPodsServer
	// Socket is where Serve listens.
	Socket string

	mu    sync.Mutex // guards what follows
	pods  []*corev1.Pod
	err   error
	calls []string
}

// New is a kubelet of pods, not yet serving.
func New(pods ...*corev1.Pod) *Kubelet { return &Kubelet{pods: pods} }

// Add gives the kubelet more pods, as a kubelet learns of new ones.
func (k *Kubelet) Add(pods ...*corev1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods = append(k.pods, pods...)
}

// Set replaces the kubelet's pods.
func (k *Kubelet) Set(pods ...*corev1.Pod) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.pods = pods
}

// Failing makes every call answer err (a gRPC status; nil to answer again), and returns k.
func (k *Kubelet) Failing(err error) *Kubelet {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.err = err
	return k
}

// Calls are the calls answered so far: "GetPod <uid>" or "ListPods".
func (k *Kubelet) Calls() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return slices.Clone(k.calls)
}

// Serve serves k on socket (its directory made if missing) until the test ends, and returns k.
func (k *Kubelet) Serve(t testing.TB, socket string) *Kubelet {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(socket), 0o750); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	k.Socket = socket
	s := grpc.NewServer()
	podsv1alpha1.RegisterPodsServer(s, k)
	go func() { _ = s.Serve(ln) }()
	t.Cleanup(s.Stop)
	return k
}

// call records one call and returns the pods and the error to answer it with.
func (k *Kubelet) call(what string) ([]*corev1.Pod, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = append(k.calls, what)
	return slices.Clone(k.pods), k.err
}

// GetPod answers the pod of the request's UID, or NotFound.
func (k *Kubelet) GetPod(_ context.Context, req *podsv1alpha1.GetPodRequest) (*podsv1alpha1.GetPodResponse, error) {
	pods, err := k.call("GetPod " + req.PodUID)
	if err != nil {
		return nil, err
	}
	for _, p := range pods {
		if string(p.UID) == req.PodUID {
			b, err := p.Marshal()
			return &podsv1alpha1.GetPodResponse{Pod: b}, err
		}
	}
	return nil, status.Errorf(codes.NotFound, "pod %s not found", req.PodUID)
}

// ListPods answers every pod.
func (k *Kubelet) ListPods(context.Context, *podsv1alpha1.ListPodsRequest) (*podsv1alpha1.ListPodsResponse, error) {
	pods, err := k.call("ListPods")
	if err != nil {
		return nil, err
	}
	resp := &podsv1alpha1.ListPodsResponse{}
	for _, p := range pods {
		b, err := p.Marshal()
		if err != nil {
			return nil, err
		}
		resp.Pods = append(resp.Pods, b)
	}
	return resp, nil
}
