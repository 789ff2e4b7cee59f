// Package cniplugin is the linkerd-cni chained CNI plugin: it parses the Linkerd-compatible
// network config, looks the pod up (the node agent's cache, or the Kubernetes API), merges the
// pod's and its namespace's config.linkerd.io annotations into an iptables.Config, and writes
// (ADD), verifies (CHECK) or removes (DEL) the redirect rules inside the pod's network namespace
// through the same backends as proxy-init.
//
// What it decides, and where:
//   - config.go: the network config JSON, validated as a whole before anything happens;
//   - pod.go: the few fields of pods, namespaces and services the plugin reads; which pods are
//     meshed, and how annotations override the config (pure, no I/O);
//   - plugin.go: the CNI commands, the failure policy and the logging;
//   - agent.go: the node agent, asked first;
//   - companion.go: a call that must read the API, run in the companion binary. This package
//     links no Kubernetes client (package kubeapi is the plugin's, in the companion), so that
//     the node's plugin starts as fast as a bare Go program.
//
// Limits: the plugin only ever writes its CNI result to stdout; logs go to stderr and optionally
// to log_file. It enters namespaces only through internal/netnsutil and never decides which rules
// exist: the iptables package does. DEL never fails, so it can never block sandbox teardown.
package cniplugin
