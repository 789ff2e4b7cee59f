// Package e2e is the end-to-end suite: a two-node, dual-stack Kubernetes cluster whose
// containerd (2.x built from Go modules, or Debian's 1.6: E2E_RUNTIME), runc and kubelets run our
// images, the linkerd-cni DaemonSet, meshed pods, and the CNI plugin as the runtime calls it. Its
// tests carry the build tag e2e (`make e2e`); this package holds the cluster. It is a module of
// its own: it builds its images with the release tooling's tools/images, which the product's
// module does not require.
//
// Each node lives in a network and a mount namespace of its own, held by a re-executed test
// binary (the holder), never linked to the machine's root network namespace:
//   - tmpfs over /run and /var/lib, and overlays over /etc and /opt whose writes land in that
//     tmpfs, so containerd's fixed paths (/run/containerd/s, /var/lib/cni) and the DaemonSet's
//     hostPath directories (/etc/cni/net.d, /opt/cni/bin) are the node's own;
//   - plain files bind-mounted over the host-wide sysctls the kubelet writes at start, so the
//     machine's values never change, and a second, uncovered proc for user-namespace pods;
//   - a veth pair joins the two nodes' namespaces (192.0.2.1 and .2, 2001:db8::1 and ::2), each
//     routing the other's pod ranges; node A's lo carries 198.51.100.1, the "kubernetes"
//     Service's IP, so pods on both nodes reach the API server without a kube-proxy;
//   - etcd and kube-apiserver (test/kubetest) listen in node A's network namespace;
//     containerd and the kubelet run in each node's namespaces (nsenter), the controller manager
//     and the scheduler in A's;
//   - the kubelets' cgroups live under a cgroup root of the cluster's, removed at the end.
//
// Limits: root only, Linux only; the cluster costs about two GiB of memory. Pods reach nothing
// outside the cluster.
//
// # Scenarios
//
// The scenarios (root, `make e2e`; docs/e2e.md lists each): our images on the cluster from the
// default rendering, a meshed pod, an init-container pod, unmeshed and excluded pods, repair and
// its scope per node, the node agent per node (healing in place, drift, lookups with no API
// request, plugin logs), teardown, both families and across nodes, user-namespace pods, Linkerd's
// own injected pod specs, STATUS and node readiness, a rolling upgrade under pod churn, 30 pods at
// once, the API unreachable from the plugin, and nothing left on the machine afterwards.
package e2e
