// Package e2e is the end-to-end suite: a single-node Kubernetes cluster whose containerd, runc
// and kubelet run our images, the linkerd-cni DaemonSet, meshed pods, and the CNI plugin as the
// runtime calls it. Its tests carry the build tag e2e (`make e2e`); this package holds the node.
//
// The node lives in a network and a mount namespace of its own, held by a re-executed test binary
// (the holder), never linked to the machine's root network namespace:
//   - tmpfs over /run and /var/lib, and overlays over /etc and /opt whose writes land in that
//     tmpfs, so containerd's fixed paths (/run/containerd/s, /var/lib/cni) and the DaemonSet's
//     hostPath directories (/etc/cni/net.d, /opt/cni/bin) are the node's own;
//   - plain files bind-mounted over the host-wide sysctls the kubelet writes at start, so the
//     machine's values never change;
//   - a veth pair inside the namespace gives the node 192.0.2.1/24, and lo carries 198.51.100.1,
//     the "kubernetes" Service's IP, so pods reach the API server without a kube-proxy;
//   - etcd and kube-apiserver (internal/kubetest) listen in that network namespace; containerd,
//     kube-controller-manager, kube-scheduler and the kubelet run in both namespaces (nsenter);
//   - the kubelet's cgroups live under a cgroup root of their own, removed at the end.
//
// Limits: root only, Linux only, one node at a time per machine is not required but each node
// costs about a GiB of memory. Pods reach nothing outside the node.
package e2e
