// Package agent is the linkerd-cni node agent, `linkerd-cni agent` in the DaemonSet (and, in its
// delete mode without socket or audit, `linkerd-cni repair`, Linkerd's repair controller). On its
// node it:
//
//   - watches the node's pods (field selector spec.nodeName), and, for lookups and audits, the
//     namespaces and the Service default/kubernetes; no other watch;
//   - serves the CNI plugin on a root-only UNIX socket (package cniplugin/wire, socket.go): after
//     checking the peer (CAP_SYS_ADMIN in the initial user namespace), it writes an ADD that
//     carries the pod's network namespace as a descriptor (route 1, write.go), or answers an ADD
//     or CHECK with the pod, its namespace and default/kubernetes from its watch cache (route 2:
//     the plugin writes, with no API request); it hears of a DEL and takes the plugin's report of
//     the call. It answers only for pods of its node, and otherwise with a typed error, on which
//     the plugin reads the API itself;
//   - audits every meshed pod of the node, on pod events and on a period, with CHECK's logic
//     against the settings the pod's sandbox was set up with, finding the pod's network namespace
//     through the CRI (sandbox.go), and sweeps what the plugin left for sandboxes gone without a
//     DEL;
//   - acts on a pod whose rules are missing or differ, by mode: repair rewrites them in place,
//     delete deletes the pod so its owner recreates it (Linkerd's behaviour, also for a failed
//     linkerd-network-validator), report only records; each records an Event on the pod;
//   - serves /live, /ready and /metrics, and prints every plugin call's log lines, so they
//     appear in `kubectl logs`.
//
// RBAC: pods list, watch (its node's); namespaces list, watch and the Service default/kubernetes
// by name; events.k8s.io events create; pods delete only in delete mode. docs/agent.md tables
// every privilege and the code that needs it, and states the limits.
//
// # Tests
//
// Flags, the node's conflist, the CRI finder against a fake CRI server serving each runtime's
// verbose sandbox status (testdata/cri), validator failure detection; against a real
// kube-apiserver with real namespaces (root, TestAgent): both routes of ADD, CHECK and DEL,
// refused messages and peers, legacy mode, installer_ready, audits of drifted rules in each mode;
// BenchmarkAudit (110 pods).
package agent
