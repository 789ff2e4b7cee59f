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
//   - plugin.go: the CNI commands, the failure policy and the logging, in two roles, one per
//     constructor: NewNodePlugin (the runtime's) and NewStandalone (a given PodAPI: tests, audits);
//   - agent.go: the pod from the node agent (protocol: package wire), asked first;
//   - kubeapi.go: the pod from the API server, with the standard library's HTTPS client over the
//     installer's JSON kubeconfig, so that the node's plugin starts as a small Go program does;
//   - audit.go: CHECK (and a rewrite) for a running pod, for the node agent's audits;
//   - record.go: what ADD merged from annotations, recorded on the node, so that CHECK and the
//     audits use the settings of the sandbox's set-up, not annotations edited since.
//
// Limits: whatever the route to the pod, this process writes the rules; the agent never does it
// for a plugin. The plugin only ever writes its CNI result to stdout; logs go to stderr and
// optionally to log_file. It enters namespaces only through internal/netnsutil and never decides
// which rules exist: the iptables package does. DEL never fails, so it can never block sandbox
// teardown.
package cniplugin
