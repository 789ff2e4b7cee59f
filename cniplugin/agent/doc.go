// Package agent is the linkerd-cni node agent, `linkerd-cni agent` in the DaemonSet (and, in its
// delete mode without socket or audit, `linkerd-cni repair`, Linkerd's repair controller). On its
// node it:
//
//   - watches the node's pods (field selector spec.nodeName), and, for lookups and audits, the
//     namespaces (their annotations count) and the Service default/kubernetes; no other watch;
//   - serves the CNI plugin on a UNIX socket (root only, in a directory only root can enter;
//     package cniplugin/wire, socket.go): after checking the peer (CAP_SYS_ADMIN in the initial
//     user namespace, as the runtime-run plugin has), it writes an ADD whose request carries the
//     pod's network namespace as a descriptor (route 1, write.go: the descriptor checked against
//     the runtime's pin at CNI_NETNS and against its own and the node's namespace, the rules of
//     the node's own network config, the plugin's code), or declines and, as for any lookup,
//     answers an ADD or CHECK with the pod, its namespace and default/kubernetes from its watch
//     cache (route 2: the plugin writes), so a meshed ADD makes no API request; it hears of a DEL
//     (its audits then leave that sandbox alone), and takes the plugin's report of the call
//     (metrics, log lines). It answers only for pods of its node, and otherwise with a typed
//     error (not synced, pod not seen within the lookup wait, a refused peer, namespace or
//     message), on which the plugin reads the API itself;
//   - audits every meshed pod of the node, on pod events and on a period, with CHECK's logic
//     against the settings the pod's sandbox was set up with (the plugin's record; edits since
//     are reported, not applied), on a few workers that wait for a namespace's lock only briefly,
//     finding the pod's network namespace through the CRI (sandbox.go), and sweeps the lock
//     files and records the plugin left for sandboxes gone without a DEL;
//   - acts on a pod whose rules are missing or differ, by mode: repair rewrites them in place
//     (the same write as ADD, under the same lock), delete deletes the pod so its owner recreates
//     it (Linkerd's behaviour, also for a failed linkerd-network-validator), report only records;
//     each records an Event on the pod saying what was wrong and what was done;
//   - serves /live, /ready and /metrics (Prometheus: the plugin's calls, which the plugin reports
//     over the socket, the lookups' source, the audits and what they did, the node's CNI config),
//     and prints every plugin call's log lines, so they appear in `kubectl logs`.
//
// RBAC: pods list, watch (its node's); namespaces list, watch and the Service default/kubernetes
// alone, by name (lookups, audit); events.k8s.io events create; pods delete only in delete mode,
// and only on its own node (the chart's admission policy). docs/agent.md tables every privilege
// and the code that needs it.
//
// Limits: it acts only on pods whose sandbox the CRI reports ready; a pod whose validator failed
// with restartPolicy Never is not rerun by healing, unless an admission policy (the chart's
// validatorRestart) gave the validator a restart rule for exit code 95. In delete mode a
// drifted pod without an owner is reported, not deleted (nothing would recreate it); a pod whose
// validator failed is deleted whatever its owner, as Linkerd does.
//
// # Tests
//
// Flags, the node's conflist, the CRI finder against a fake CRI server serving each runtime's
// verbose sandbox status (testdata/cri: containerd 1.6 and 2.x, CRI-O with and without an infra
// process): the newest ready sandbox's namespace opened once from the runtime's path and let go
// with its sandbox, the PID fallback (a reused PID and the node's own namespace refused; root),
// validator failure detection.
//
// Against a real kube-apiserver with real namespaces (root, TestAgent): ADD, CHECK and DEL with the
// pod from the agent and no lookup (the node config's rules exactly, the reports in the agent's
// log, metrics, only list and watch by the agent), a pod of another node and one the watch delivers
// during the wait, refused messages (protocol 1's forged config and a namespace descriptor, a
// config field, not JSON, an unknown command, oversized: each logged with the PID, counted, nothing
// written, still serving), peers without CAP_SYS_ADMIN or in a user namespace of their own
// (setpriv, unshare), legacy mode, installer_ready, audits of missing, different, other-backend,
// half-applied and hand-edited rules in each mode, annotations invalid after start, a failed
// validator healed in place, the periodic audit; BenchmarkAudit (110 pods). `make race` runs its
// unit tests under the race detector.
package agent
