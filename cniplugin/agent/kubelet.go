package agent

// The kubelet's pods API (KEP-4188; feature gate PodsAPI, on by default from Kubernetes 1.37)
// serves the node's pods, spec included, over gRPC on a root-only UNIX socket, with neither the
// API server nor a token. The agent asks it only when its own watch cannot answer (not synced yet:
// the API server may be down; a pod not delivered yet): the kubelet limits every node-local client
// alike (100 requests a second, bursts of 10), so the watch stays the first source.

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	podsv1alpha1 "k8s.io/kubelet/pkg/apis/pods/v1alpha1"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
)

// DefaultKubeletPodsSocket is the kubelet's pods API socket as the chart mounts it: the node's
// <kubeletRootDir>/pods-api directory, read-only, at /host/kubelet/pods-api.
const DefaultKubeletPodsSocket = "/host/kubelet/pods-api/pods-api.sock"

// kubeletTimeout bounds one request to the kubelet: it answers from memory, on the node.
const kubeletTimeout = time.Second

// kubeletPods reads pods from the kubelet's pods API.
type kubeletPods struct {
	path   string
	conn   *grpc.ClientConn
	client podsv1alpha1.PodsClient
}

// newKubeletPods returns a client of the kubelet's pods API at the socket path. It connects on
// first use, and again after the kubelet restarts (it replaces the socket).
func newKubeletPods(path string) (*kubeletPods, error) {
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("the kubelet's pods API at %s: %w", path, err)
	}
	return &kubeletPods{path: path, conn: conn, client: podsv1alpha1.NewPodsClient(conn)}, nil
}

func (k *kubeletPods) Close() error { return k.conn.Close() }

// pod returns the pod namespace/name of the node, by uid when it is known (K8S_POD_UID, which
// containerd and CRI-O pass), else by name among the node's pods. Before each request the socket
// is checked as the plugin checks the agent's: the agent acts on the answer, so it talks only to
// a socket that root owns in a directory only root can write.
func (k *kubeletPods) pod(ctx context.Context, namespace, name string, uid types.UID) (*corev1.Pod, error) {
	if err := wire.CheckSocket(k.path); err != nil {
		return nil, fmt.Errorf("the kubelet's pods API: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, kubeletTimeout)
	defer cancel()
	if uid == "" {
		return k.byName(ctx, namespace, name)
	}
	resp, err := k.client.GetPod(ctx, &podsv1alpha1.GetPodRequest{PodUID: string(uid)})
	if err != nil {
		return nil, k.failed("GetPod", err)
	}
	pod := &corev1.Pod{}
	if err := pod.Unmarshal(resp.GetPod()); err != nil {
		return nil, fmt.Errorf("the kubelet's pods API at %s: pod uid %s: %w", k.path, uid, err)
	}
	if pod.Namespace != namespace || pod.Name != name || pod.UID != uid {
		return nil, fmt.Errorf("asked for %s/%s (uid %s), got %s/%s (uid %s): the kubelet answered with another pod",
			namespace, name, uid, pod.Namespace, pod.Name, pod.UID)
	}
	return pod, nil
}

func (k *kubeletPods) byName(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
	resp, err := k.client.ListPods(ctx, &podsv1alpha1.ListPodsRequest{})
	if err != nil {
		return nil, k.failed("ListPods", err)
	}
	var found *corev1.Pod
	for i, b := range resp.GetPods() {
		p := &corev1.Pod{}
		if err := p.Unmarshal(b); err != nil {
			return nil, fmt.Errorf("the kubelet's pods API at %s: pod %d of the list: %w", k.path, i, err)
		}
		// Of two incarnations of one name, the one not being deleted is the one set up.
		if p.Namespace == namespace && p.Name == name && (found == nil || found.DeletionTimestamp != nil) {
			found = p
		}
	}
	if found == nil {
		return nil, fmt.Errorf("the kubelet's pods API at %s: pod %s/%s is not among the node's pods", k.path, namespace, name)
	}
	return found, nil
}

// failed names the kubelet's refusals the way an operator reads them.
func (k *kubeletPods) failed(method string, err error) error {
	switch status.Code(err) {
	case codes.Unavailable:
		return fmt.Errorf("the kubelet's pods API at %s is not available (is the PodsAPI feature gate on, Kubernetes 1.36 or later?): %s: %w", k.path, method, err)
	case codes.Unimplemented:
		return fmt.Errorf("the kubelet at %s does not serve %s: %w", k.path, method, err)
	case codes.FailedPrecondition:
		return fmt.Errorf("the kubelet at %s is still starting: %s: %w", k.path, method, err)
	case codes.ResourceExhausted:
		return fmt.Errorf("the kubelet at %s rate-limited the request: %s: %w", k.path, method, err)
	}
	return fmt.Errorf("the kubelet's pods API at %s: %s: %w", k.path, method, err)
}
