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
//   - plugin.go: the CNI commands, the failure policy and the logging, in three roles, one per
//     constructor: NewNodePlugin (the runtime's), NewStandalone (a given PodAPI: tests, audits)
//     and NewAgentWriter (the node agent's write of an ADD, agentwriter.go);
//   - agent.go: the node agent (protocol: package wire), asked first: it writes an ADD (route 1),
//     or gives the pod and the plugin writes (route 2);
//   - kubeapi.go: the pod from the API server, with the standard library's HTTPS client over the
//     installer's JSON kubeconfig, so that the node's plugin starts as a small Go program does;
//   - agentaudit.go: CHECK (and a rewrite) for a running pod, for the node agent's audits;
//   - record.go: what ADD merged from annotations, recorded on the node, so that CHECK and the
//     audits use the settings of the sandbox's set-up, not annotations edited since.
//
// Limits: an ADD is written by the node agent (route 1) or by this process (route 2), with the
// same code either way; CHECK and DEL are always this process's. The plugin only ever writes its CNI result to stdout; logs go to stderr and
// optionally to log_file. It enters namespaces only through internal/netnsutil and never decides
// which rules exist: the iptables package does. DEL never fails, so it can never block sandbox
// teardown.
//
// # Tests
//
// Without root: config parsing per CNI version, keys, defaults and errors; CNI_ARGS; classification
// and annotation merge (with numeric bounds and malformed values); API request counts; the failure
// policy with a fake applier (policy_test.go: ADD writes and CHECK matches, CHECK names the
// difference, an ADD failure prints no result, DEL warns but succeeds); DEL never fails in the
// binary; fuzzers for the config and the merge (`make fuzz`).
//
// As root with a kube-apiserver, TestCNI: an isolated node namespace, the real bridge, host-local
// and loopback plugins, libcni ADD/CHECK/DEL per mode, native sidecars, annotations, control-plane
// pods, excluded namespaces, missing pods, revoked credentials, a hung API, STATUS, 50 concurrent
// ADDs, the log lines, the API gone (all of it through the plugin binary, as the node runs it); the
// kubeconfig's refusals (TestKubeconfigRefused: exec, auth-provider, client certificates,
// passwords, an http server, an unknown field, YAML, each with the exact error naming the file and
// the field, nothing written) and the client's requests and explanations against a TLS server
// (TestKubeClient); linkerd-cni alone in a conflist (a Multus NetworkAttachmentDefinition, CNI
// 0.3.1 to 1.1.0, no prevResult), and pods with hostUsers: false in nft, legacy and auto (the
// native table in each). TestCNIWithAgent: with the node agent, no API request per meshed ADD in
// the audit log (nft, and legacy), the reports in the agent's log, two requests once it stops.
//
// The plugin's agent client against a fake agent (root, agent_test.go): no agent, a socket replaced
// by a file, a directory others may write, a silent agent (the fallback within its bound), garbled
// answers, another protocol, each typed refusal, with its log line; the request (the pod, nothing
// else); the agent's pod used in place of the API; a lookup without the Service; DEL told to the
// agent; the same CNI error code on both routes (TestErrorCodesBothRoutes). Run one part with, for
// example, `go test -count=1 -run TestCNI -v ./cniplugin/` (root, after make kube-bins) or `go test
// -count=1 -run '^$' -bench ADD -benchtime 1x ./cniplugin/` (the CNI part of make bench).
package cniplugin
