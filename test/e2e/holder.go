package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// holderEnv carries a holderSpec into the re-executed test binary that holds the node's
// namespaces.
const holderEnv = "E2E_NODE_HOLDER"

// Addresses of the cluster. All are documentation ranges, and none is routed anywhere but
// between the nodes: their network namespaces are linked to each other and to nothing else.
const (
	serviceIP  = "198.51.100.1"    // the "kubernetes" Service, on node A's lo
	serviceNet = "198.51.100.0/24" // --service-cluster-ip-range, routed to node A
)

// nodeSpec is one node's name and addresses: eth0 (IPv4 and IPv6, the node's InternalIPs, on
// the link between the nodes) and its pods' ranges, from host-local.
type nodeSpec struct {
	Name             string
	Suffix           string // its cgroup's and its files' name
	IPv4, IPv6       string
	PodNet4, PodNet6 string
}

// nodeSpecs are the cluster's nodes; the control plane runs in the first one's network
// namespace.
var nodeSpecs = []nodeSpec{
	{Name: "e2e-node-a", Suffix: "a", IPv4: "192.0.2.1", IPv6: "2001:db8::1", PodNet4: "203.0.113.0/25", PodNet6: "2001:db8:1::/64"},
	{Name: "e2e-node-b", Suffix: "b", IPv4: "192.0.2.2", IPv6: "2001:db8::2", PodNet4: "203.0.113.128/25", PodNet6: "2001:db8:2::/64"},
}

// stateDir is the node's own directory, on its tmpfs over /run.
const stateDir = "/run/e2e-node"

// KubeletSysctls are the machine-wide sysctls the kubelet sets at start (its
// setupKernelTunables), with the values it sets. Inside the node each is covered by a plain file
// holding the machine's value, so the kubelet writes the file and the machine keeps its own.
var KubeletSysctls = map[string]string{
	"vm/overcommit_memory": "1", "vm/panic_on_oom": "0", "kernel/panic": "10", "kernel/panic_on_oops": "1",
	"kernel/keys/root_maxkeys": "1000000", "kernel/keys/root_maxbytes": "25000000",
}

// holderSpec is what the holder needs to build the node.
type holderSpec struct {
	HostNetNS, HostMntNS uint64 // the namespaces it must not be in
	PluginsDir           string // the containernetworking plugins to install in /opt/cni/bin
	Conflist             string // the primary CNI config, /etc/cni/net.d/10-bridge.conflist
	ServiceIP            bool   // carry the kubernetes Service's IP on lo (the control plane's node)
}

// HolderMain belongs at the top of the e2e TestMain. In the re-executed holder it builds the node
// inside the namespaces it was started in, says "ready" on stdout and waits until its stdin
// closes, then exits; otherwise it returns.
func HolderMain() {
	raw, ok := os.LookupEnv(holderEnv)
	if !ok {
		return
	}
	var spec holderSpec
	err := json.Unmarshal([]byte(raw), &spec)
	if err == nil {
		err = buildNode(spec)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e node holder: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// startHolder re-executes the test binary in a new network and mount namespace (/ made private
// first, so no mount leaks back) and waits until the node inside is built.
func startHolder(spec holderSpec, logPath string) (*exec.Cmd, io.Closer, error) {
	raw, err := json.Marshal(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("holder spec: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return nil, nil, fmt.Errorf("find the test binary: %w", err)
	}
	logf, err := os.Create(logPath)
	if err != nil {
		return nil, nil, fmt.Errorf("holder log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), holderEnv+"="+string(raw))
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Unshareflags: unix.CLONE_NEWNET | unix.CLONE_NEWNS,
		Pdeathsig:    syscall.SIGKILL,
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("holder stdin: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("holder stdout: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("start holder: %w", err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		stdin.Close()
		werr := cmd.Wait()
		log, _ := os.ReadFile(logPath)
		return nil, nil, fmt.Errorf("node holder failed (%v): %s", werr, strings.TrimSpace(string(log)))
	}
	return cmd, stdin, nil
}

// buildNode runs in the holder, inside the new namespaces.
func buildNode(spec holderSpec) error {
	// Nothing is mounted or linked until the namespaces are known to be new ones.
	for _, ns := range []struct {
		name string
		host uint64
	}{{"net", spec.HostNetNS}, {"mnt", spec.HostMntNS}} {
		ino, err := nsInode("/proc/self/ns/" + ns.name)
		if err != nil {
			return err
		}
		if ino == ns.host || ns.host == 0 {
			return fmt.Errorf("refusing to build the node: %s namespace %d is the machine's", ns.name, ino)
		}
	}
	for _, m := range []string{"/run", "/var/lib"} {
		if err := detachMountsUnder(m); err != nil {
			return err
		}
		if err := unix.Mount("tmpfs", m, "tmpfs", 0, "mode=0755"); err != nil {
			return fmt.Errorf("mount tmpfs on %s: %w", m, err)
		}
	}
	// Shared, as a systemd host's /run is: the agent mounts the pods' namespaces from
	// /var/run/netns with HostToContainer propagation, which the runtime allows only from a
	// shared or slave mount. The peer group is the node's alone (/ was made private above it).
	if err := unix.Mount("", "/run", "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make /run shared: %w", err)
	}
	// And / too, as on a systemd host: containerd 1.6 looks the hostPath /var/run/netns up in
	// mountinfo without following the /var/run symlink, so it finds /, not /run. Go's exec made
	// / private in this namespace, so the new peer group is the node's alone.
	if err := unix.Mount("", "/", "", unix.MS_SHARED, ""); err != nil {
		return fmt.Errorf("make / shared: %w", err)
	}
	// Overlays, not tmpfs: the node still sees the machine's /etc (resolv.conf, passwd) and /opt.
	for _, d := range []string{"/etc", "/opt"} {
		upper, work := filepath.Join(stateDir, d, "upper"), filepath.Join(stateDir, d, "work")
		for _, p := range []string{upper, work} {
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", d, upper, work)
		if err := unix.Mount("overlay", d, "overlay", 0, opts); err != nil {
			return fmt.Errorf("mount overlay on %s: %w", d, err)
		}
	}
	if err := coverSysctls(); err != nil {
		return err
	}
	// The covers hide parts of /proc, and the kernel lets a container in a user namespace mount
	// its own proc only where some proc mount is fully visible: this one, which nothing uses.
	if err := os.MkdirAll(filepath.Join(stateDir, "proc"), 0o555); err != nil {
		return err
	}
	if err := unix.Mount("proc", filepath.Join(stateDir, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount a fully visible proc for user-namespace pods: %w", err)
	}
	if err := installCNI(spec); err != nil {
		return err
	}
	return nodeNetwork(spec.ServiceIP)
}

// coverSysctls bind-mounts a file holding each host-wide sysctl's current value over it, then
// checks that each one really is covered: an uncovered one would let the kubelet change the
// machine.
func coverSysctls() error {
	dir := filepath.Join(stateDir, "sysctl")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	for k := range KubeletSysctls {
		target := "/proc/sys/" + k
		val, err := os.ReadFile(target)
		if err != nil {
			return fmt.Errorf("read sysctl %s: %w", k, err)
		}
		file := filepath.Join(dir, strings.ReplaceAll(k, "/", "."))
		if err := os.WriteFile(file, val, 0o644); err != nil {
			return err
		}
		if err := unix.Mount(file, target, "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("cover sysctl %s: %w", k, err)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	for k := range KubeletSysctls {
		if !strings.Contains(string(mounts), " /proc/sys/"+k+" ") {
			return fmt.Errorf("sysctl %s is not covered after the bind mount", k)
		}
	}
	return nil
}

// installCNI gives the node a primary CNI network, as a cluster's network add-on would: the
// plugins in /opt/cni/bin and a bridge conflist in /etc/cni/net.d.
func installCNI(spec holderSpec) error {
	for _, d := range []string{"/opt/cni/bin", "/etc/cni/net.d"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	entries, err := os.ReadDir(spec.PluginsDir)
	if err != nil {
		return fmt.Errorf("cni plugins: %w", err)
	}
	for _, e := range entries {
		data, err := os.ReadFile(filepath.Join(spec.PluginsDir, e.Name()))
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join("/opt/cni/bin", e.Name()), data, 0o755); err != nil {
			return err
		}
	}
	return os.WriteFile("/etc/cni/net.d/10-bridge.conflist", []byte(spec.Conflist), 0o644)
}

// nodeNetwork brings lo up, with the Service IP on the control plane's node, and turns on
// forwarding for both families (each network namespace has its own, off by default): the node
// routes between its pods' bridge and the link to the other node. The link itself is made by
// linkNodes, which needs both namespaces.
func nodeNetwork(serviceIP bool) error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if serviceIP {
		if err := netlink.AddrAdd(lo, mustAddr(serviceIPCIDR)); err != nil {
			return fmt.Errorf("add %s to lo: %w", serviceIPCIDR, err)
		}
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"} {
		if err := os.WriteFile("/proc/sys/"+k, []byte("1"), 0o644); err != nil {
			return fmt.Errorf("enable forwarding in the node: %w", err)
		}
	}
	return nil
}

const serviceIPCIDR = serviceIP + "/32"

// mustAddr parses a CIDR the harness itself spells.
func mustAddr(cidr string) *netlink.Addr {
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		panic(err)
	}
	return a
}

// nsInode returns the inode of a namespace file such as /proc/PID/ns/net.
func nsInode(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", path, err)
	}
	return st.Ino, nil
}

// detachMountsUnder lazily unmounts, in the node's own (private) mount namespace, what the
// machine had mounted below dir, deepest first. The node's tmpfs over dir hides them but
// mountinfo still lists them, and containerd resolves a hostPath's mount from mountinfo: the
// machine's /run/netns (other tests' `ip netns add`) would be taken for the node's, which is
// not shared, and the agent's HostToContainer mount of /var/run/netns refused.
func detachMountsUnder(dir string) error {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return err
	}
	var under []string
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			under = append(under, f[4])
		}
	}
	// Deeper paths are longer: unmount them before their parents.
	slices.SortFunc(under, func(a, b string) int { return len(b) - len(a) })
	for _, m := range under {
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
			return fmt.Errorf("detach the machine's mount %s in the node: %w", m, err)
		}
	}
	return nil
}
