package e2e

import "fmt"

// bridgeConflist is a node's primary CNI network, as a network add-on would install it: a
// bridge with host-local addresses from the node's two pod ranges (IPv4 and IPv6) and port
// mappings. The linkerd-cni installer appends itself.
func bridgeConflist(cniVersion string, s nodeSpec) string {
	return fmt.Sprintf(`{
  "cniVersion": %q,
  "name": "e2e-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": %q}], [{"subnet": %q}]],
        "routes": [{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, cniVersion, s.PodNet4, s.PodNet6)
}

// containerd2Config runs containerd 2 inside a node (config version 3): root and state on the
// node's tmpfs, the cached runc (@RUNC@) with cgroupfs (the kubelet's driver), the pause image
// the harness imports, and the CNI directories the DaemonSet's hostPath volumes point at. Pod
// network namespaces stay where containerd keeps them by default, /var/run/netns (the node's own
// /run), which the agent mounts; apparmor is off because profiles are loaded machine-wide;
// restrict_oom_score_adj keeps containers' OOM scores no lower than containerd's own. NRI and the
// snapshotters the node does not use are off.
const containerd2Config = `version = 3
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = [
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.erofs",
  "io.containerd.snapshotter.v1.zfs",
]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "` + PauseImage + `"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/opt/cni/bin"]
    conf_dir = "/etc/cni/net.d"
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "@RUNC@"
        SystemdCgroup = false
`

// containerd1Config is the same for Debian's containerd 1.6 (config version 2).
const containerd1Config = `version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
]
[grpc]
  address = "/run/containerd/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "` + PauseImage + `"
  restrict_oom_score_adj = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
`

// kubeletConfigTmpl is the kubelet's configuration; %s is the cgroup root.
//   - failCgroupV1: false, because the machine runs cgroup v1 (hybrid), which kubelet 1.37
//     refuses by default; cgroupfs, because containerd 1.6 lacks the RuntimeConfig call that
//     would tell the kubelet the runtime's driver (containerd 2 reports cgroupfs, the same).
//   - The API server reaches no kubelet port here, so the kubelet serves only loopback, allows
//     every request on it, and nothing authenticates.
//   - Eviction and image garbage collection are off: the node's disk is tmpfs, the machine's
//     memory is shared, and the imported images can never be pulled again.
//   - Static pods come from StaticPodDir, read every second: the one kind of new pod a node
//     starts while the API server is stopped (KubeletLookup).
const kubeletConfigTmpl = `apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: %s
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
address: 127.0.0.1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
podLogsDir: /var/lib/pod-logs
failSwapOn: false
evictionHard:
  memory.available: "0%%"
  nodefs.available: "0%%"
  nodefs.inodesFree: "0%%"
  imagefs.available: "0%%"
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusUpdateFrequency: 2s
syncFrequency: 5s
staticPodPath: ` + StaticPodDir + `
fileCheckFrequency: 1s
`

// StaticPodDir is where each node's kubelet reads static pods, in the node's own /var/lib.
const StaticPodDir = "/var/lib/static-pods"
