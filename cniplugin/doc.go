// Package cniplugin is the linkerd-cni chained CNI plugin: it parses the Linkerd-compatible
// network config, looks the pod up (the node agent, the kubelet's pods API, or the Kubernetes
// API), merges the pod's and its namespace's config.linkerd.io annotations into an
// iptables.Config, and writes (ADD), verifies (CHECK) or removes (DEL) the redirect rules inside
// the pod's network namespace through the same backends as proxy-init.
//
// What it decides, and where:
//   - config.go: the network config JSON, validated as a whole before anything happens;
//   - pod.go: the few fields of pods, namespaces and services the plugin reads; which pods are
//     meshed, and how annotations override the config (pure, no I/O);
//   - plugin.go: the CNI commands, the failure policy and the logging, in the three roles of
//     Plugin's constructors (NewAgentWriter, the node agent's write of an ADD: agentwriter.go);
//   - agentclient.go: the node agent (protocol: package wire), asked first: it writes an ADD
//     (route 1), or gives the pod and the plugin writes (route 2);
//   - kubelet.go, kubeapi.go: the pod from the kubelet, else from the API server (standard library);
//   - agentaudit.go: CHECK (and a rewrite) for a running pod, for the node agent's audits;
//   - record.go: what ADD merged from annotations, for CHECK and the audits (not later edits).
//
// Limits: CHECK and DEL are always this process's. The plugin only ever writes its CNI result to
// stdout; logs go to stderr and optionally to log_file. It enters namespaces only through
// internal/netnsutil and never decides which rules exist: the iptables package does. DEL never
// fails, so it can never block sandbox teardown.
//
// Tests: without root, the parsing, merge and failure policy over a fake applier, and fuzzers; as
// root with a kube-apiserver (after make kube-bins), the plugin binary through libcni with the
// real reference plugins, the API client and the node agent's routes.
package cniplugin
