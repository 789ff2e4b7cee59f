// Package repair is `linkerd-cni repair`, Linkerd's repair controller (and its name,
// linkerd-cni-repair-controller, and flags and environment): the node agent (package
// cniplugin/agent) in its delete mode, with neither its socket nor its audits. In CNI mode a pod
// whose sandbox was created before linkerd-cni was in the node's CNI configuration runs without
// the redirect; its linkerd-network-validator init container (package validator) then exits 95.
// The controller watches the meshed pods (label linkerd.io/control-plane-ns) on its node
// ($LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME) and deletes (grace period 0), at most once per pod
// UID, every pod whose validator terminated with 95, so its owner recreates it with the plugin in
// place, recording each deletion as an events.k8s.io Event on the pod. Unlike Linkerd's, it also
// checks the validator's current state, so pods with restartPolicy Never (Jobs) are repaired.
// /live, /ready and /metrics (prefix linkerd_cni_repair_controller_) are served on --admin-addr.
//
// RBAC: pods get, list, watch, delete; events.k8s.io events create (Linkerd's ClusterRole);
// RemoveNodeTaint, used by the installer, additionally needs nodes get and patch.
//
// Limits: it cannot tell why the validator failed. A pod that keeps failing is deleted again each
// time it is recreated, at its owner's back-off; pods without an owner are deleted too, and not
// recreated, as in Linkerd. The agent's repair mode heals such pods in place instead.
//
// # Tests
//
// Flags; against a real kube-apiserver (root): failed pods of each kind are deleted exactly once
// with one Event, others left alone; metrics; the requests of the chart's ClusterRole; no deletes
// without the permission; RemoveNodeTaint.
package repair
