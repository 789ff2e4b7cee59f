// Package repair is `linkerd-cni repair`, Linkerd's repair controller (and its name,
// linkerd-cni-repair-controller, and flags and environment): the node agent (package
// cniplugin/agent) in its delete mode, with neither its socket nor its audits, so it needs what
// Linkerd's controller needs and nothing more. In CNI mode a pod whose sandbox was created before
// linkerd-cni was in the node's CNI configuration (after node boot or autoscaling) runs without
// the redirect; its linkerd-network-validator init container (package validator) then exits 95.
// The controller watches the pods on its node and deletes (grace period 0) every pod whose
// validator terminated with 95, so its owner recreates it, this time with the plugin in place,
// recording each deletion as an events.k8s.io Event on the pod.
//
// Beyond Linkerd's controller, it checks both the validator's current state and its last state:
// Linkerd's looks at the last state only, so it never repairs a pod with restartPolicy Never
// (Jobs), whose validator is not restarted.
//
// It watches only pods with spec.nodeName equal to $LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME and
// the label linkerd.io/control-plane-ns (every meshed pod has it). Work goes through a
// rate-limited queue with one worker, and a pod UID is deleted at most once, so one failure never
// causes two deletions. /live, /ready and /metrics (Prometheus, prefix
// linkerd_cni_repair_controller_) are served on --admin-addr.
//
// RBAC it needs: pods get, list, watch, delete; events.k8s.io events create (Linkerd's
// linkerd-cni ClusterRole grants exactly these when the repair controller is enabled).
// RemoveNodeTaint, used by the installer, additionally needs nodes get and patch.
//
// Limits: it cannot tell why the validator failed; it assumes a fresh sandbox will fix it. A
// pod that keeps failing is deleted again each time it is recreated (a new UID), at the pace of
// its owner's back-off. Pods without an owner are deleted too, and are not recreated: that is
// Linkerd's behaviour, kept for compatibility. The agent's repair mode heals such pods in place
// instead.
//
// # Tests
//
// Flags; against a real kube-apiserver (root): pods failed in the current state, the last state, as
// a Job, before or after the controller started, or held by a finalizer are each deleted exactly
// once with one Event; healthy, other-code, other-node and unmeshed pods are left alone; metrics;
// the audited requests of the ServiceAccount bound to the chart's ClusterRole for the repair
// controller; no deletes without the permission; RemoveNodeTaint.
package repair
