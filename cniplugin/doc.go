// Package cniplugin is the linkerd-cni chained CNI plugin: it parses the Linkerd-compatible
// network config, looks the pod up in the Kubernetes API, merges the pod's and its namespace's
// config.linkerd.io annotations into an iptables.Config, and writes (ADD), verifies (CHECK) or
// removes (DEL) the redirect rules inside the pod's network namespace through the same backends
// as proxy-init.
//
// What it decides, and where:
//   - config.go: the network config JSON, validated as a whole before anything happens;
//   - pod.go: the few fields of pods, namespaces and services the plugin reads; which pods are
//     meshed, and how annotations override the config (pure, no I/O);
//   - kube.go: the pod lookup, with a lean client-go REST client (neither the clientset nor
//     k8s.io/api is linked, so the plugin starts faster) and at most three GETs per pod;
//   - plugin.go: the CNI commands, the failure policy and the logging.
//
// Limits: the plugin only ever writes its CNI result to stdout; logs go to stderr and optionally
// to log_file. It enters namespaces only through internal/netnsutil and never decides which rules
// exist: the iptables package does. DEL never fails, so it can never block sandbox teardown.
package cniplugin
