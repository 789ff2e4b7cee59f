package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/test/cnitest"
	"github.com/kubemesh/proxy-init/test/kubetest"
)

// Options configures StartCluster.
type Options struct {
	// KubeNode is the kube-node binary (test/e2e/kube): kube-controller-manager, kube-scheduler
	// and kubelet.
	KubeNode string
	// Runtime is the nodes' container runtime.
	Runtime Runtime
	// Images are OCI tarballs imported into each node's containerd (namespace k8s.io) before
	// its kubelet starts; the pause image among them.
	Images []string
	// ReadyTimeout bounds the wait for the Nodes to be Ready. Default 3 minutes.
	ReadyTimeout time.Duration
	// Dir, when set, receives the configurations and logs, and is kept; by default they go to
	// a temporary directory that is removed with the test.
	Dir string
}

// Cluster is the running cluster: one control plane, in the first node's network namespace,
// and two nodes linked to each other.
type Cluster struct {
	// Dir holds the configurations and logs, on the machine's filesystem.
	Dir string
	// Runtime is the nodes' container runtime.
	Runtime Runtime
	// Control is the API server and etcd; Client is its admin client.
	Control *kubetest.Cluster
	Client  kubernetes.Interface
	// Nodes are the nodes, in nodeSpecs' order; A runs the control plane.
	Nodes []*Node
	// CgroupRoot holds every node's cgroups, the same path in every hierarchy.
	CgroupRoot string

	owner      int             // the test process's PID
	procs      []*proc         // every component, in start order
	nodeMounts map[string]bool // "mount point, type" of the nodes' own mounts, seen at Stop
	// pins hold the nodes' and their pods' namespaces from Stop until ReleasePins: while held,
	// no other namespace can take their inode numbers, so Leftovers and OursMount never
	// mistake another test's namespace for one of the cluster's.
	pins    []*os.File
	stopped bool
}

// Node is one node of the cluster: its own network and mount namespaces, containerd and kubelet.
type Node struct {
	nodeSpec
	// Client is the cluster's admin client.
	Client kubernetes.Interface
	// CgroupRoot is the kubelet's cgroup root, under the cluster's.
	CgroupRoot string
	// NetNS and MntNS are the inodes of the node's namespaces.
	NetNS, MntNS uint64

	c          *Cluster
	containerd *proc
	holder     *exec.Cmd
	holderIn   io.Closer
	podNetNS   []uint64 // pods' network namespaces seen at Stop, for Leftovers
}

// proc is a process started in a node's namespaces.
type proc struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// StartCluster builds the nodes, links them, starts the control plane and every node's
// components, and waits until every Node is Ready. t.Cleanup stops it, if Stop has not already.
func StartCluster(t testing.TB, opts Options) *Cluster {
	t.Helper()
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 3 * time.Minute
	}
	c := newCluster(os.Getpid())
	c.Dir, c.Runtime = opts.Dir, opts.Runtime
	if c.Dir == "" {
		c.Dir = t.TempDir()
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.logTails(t)
		}
		if err := c.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
		c.ReleasePins()
	})
	if err := c.start(t, opts); err != nil {
		t.Fatalf("start cluster: %v", err)
	}
	return c
}

func newCluster(owner int) *Cluster {
	c := &Cluster{owner: owner, CgroupRoot: fmt.Sprintf("/proxy-init-e2e-%d", owner)}
	for _, s := range nodeSpecs {
		c.Nodes = append(c.Nodes, &Node{nodeSpec: s, c: c, CgroupRoot: c.CgroupRoot + "/" + s.Suffix})
	}
	return c
}

// A and B are the two nodes; A runs the control plane.
func (c *Cluster) A() *Node { return c.Nodes[0] }
func (c *Cluster) B() *Node { return c.Nodes[1] }

// NodeOf returns the node a pod is bound to.
func (c *Cluster) NodeOf(t testing.TB, p *corev1.Pod) *Node {
	t.Helper()
	for _, n := range c.Nodes {
		if n.Name == p.Spec.NodeName {
			return n
		}
	}
	t.Fatalf("pod %s/%s is on no node of the cluster (nodeName %q)", p.Namespace, p.Name, p.Spec.NodeName)
	return nil
}

func (c *Cluster) start(t testing.TB, opts Options) error {
	began := time.Now()
	for _, d := range []string{"logs", "etc"} {
		if err := os.MkdirAll(filepath.Join(c.Dir, d), 0o755); err != nil {
			return err
		}
	}
	plugins, err := cnitest.PluginsDir()
	if err != nil {
		return err
	}
	hostNet, err := nsInode("/proc/self/ns/net")
	if err != nil {
		return err
	}
	hostMnt, err := nsInode("/proc/self/ns/mnt")
	if err != nil {
		return err
	}
	if err := makeCgroup(c.CgroupRoot); err != nil {
		return err
	}
	for i, n := range c.Nodes {
		n.holder, n.holderIn, err = startHolder(holderSpec{
			HostNetNS: hostNet, HostMntNS: hostMnt, PluginsDir: plugins,
			Conflist: bridgeConflist(c.Runtime.CNIVersion, n.nodeSpec), ServiceIP: i == 0,
		}, filepath.Join(c.Dir, "logs", "holder-"+n.Suffix+".log"))
		if err != nil {
			return err
		}
		if n.NetNS, err = nsInode(n.nsPath("net")); err != nil {
			return err
		}
		if n.MntNS, err = nsInode(n.nsPath("mnt")); err != nil {
			return err
		}
		if err := makeCgroup(n.CgroupRoot); err != nil {
			return err
		}
	}
	if err := linkNodes(c.A(), c.B()); err != nil {
		return err
	}

	a := c.A()
	c.Control = kubetest.Start(t, kubetest.Options{
		NetNSPath:               a.nsPath("net"),
		BindAddress:             "0.0.0.0",
		SecurePort:              443,
		ServingIPs:              []net.IP{net.ParseIP(a.IPv4), net.ParseIP(serviceIP)},
		ServiceAccountAdmission: true,
		ExtraAPIServerArgs: []string{
			"--service-cluster-ip-range=" + serviceNet,
			"--advertise-address=" + a.IPv4,
		},
	})
	c.Client = c.Control.Clientset
	// The control plane and node A's kubelet reach the API on 127.0.0.1; node B's on A's address.
	kubeconfig := filepath.Join(c.Dir, "etc", "admin.kubeconfig")
	if err := c.Control.WriteAdminKubeconfig(kubeconfig); err != nil {
		return err
	}
	data, err := os.ReadFile(kubeconfig)
	if err != nil {
		return err
	}
	remote := filepath.Join(c.Dir, "etc", "admin-remote.kubeconfig")
	data = bytes.ReplaceAll(data, []byte(c.Control.Host), []byte("https://"+a.IPv4+":443"))
	if err := os.WriteFile(remote, data, 0o600); err != nil {
		return err
	}

	for _, n := range c.Nodes {
		n.Client = c.Client
		if err := n.startContainerd(); err != nil {
			return err
		}
		for _, img := range opts.Images {
			if _, err := n.Run(context.Background(), "ctr", "-n", "k8s.io", "images", "import", img); err != nil {
				return fmt.Errorf("node %s: import image %s: %w", n.Name, img, err)
			}
		}
	}
	if _, err := c.startProc(a, "kube-controller-manager", opts.KubeNode, "kube-controller-manager",
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--root-ca-file="+c.Control.CAFile,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--use-service-account-credentials=false",
	); err != nil {
		return err
	}
	if _, err := c.startProc(a, "kube-scheduler", opts.KubeNode, "kube-scheduler",
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
	); err != nil {
		return err
	}
	var kubelets []*proc
	for i, n := range c.Nodes {
		kc := kubeconfig
		if i > 0 {
			kc = remote
		}
		if err := os.MkdirAll(n.Path(StaticPodDir), 0o755); err != nil {
			return err
		}
		cfg := filepath.Join(c.Dir, "etc", "kubelet-"+n.Suffix+".yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(kubeletConfigTmpl, n.CgroupRoot)), 0o644); err != nil {
			return err
		}
		kubelet, err := c.startProc(n, "kubelet-"+n.Suffix, opts.KubeNode, "kubelet",
			"--config="+cfg,
			"--kubeconfig="+kc,
			"--root-dir=/var/lib/kubelet",
			"--hostname-override="+n.Name,
			"--node-ip="+n.IPv4+","+n.IPv6,
			"--v=2",
		)
		if err != nil {
			return err
		}
		kubelets = append(kubelets, kubelet)
	}
	for i, n := range c.Nodes {
		if err := n.waitReady(kubelets[i], opts.ReadyTimeout); err != nil {
			return err
		}
	}
	t.Logf("e2e: %d nodes on %s Ready in %v (dir %s, cgroup root %s)",
		len(c.Nodes), c.Runtime.Name, time.Since(began).Round(time.Millisecond), c.Dir, c.CgroupRoot)
	return nil
}

// linkNodes joins two nodes with a veth pair, eth0 in each, made inside a's network namespace
// and moved into b's (never the machine's), and routes each node's pod ranges to the other.
// Node b also routes the Service range to a, where the API server answers on the Service IP.
func linkNodes(a, b *Node) error {
	bns, err := os.Open(b.nsPath("net"))
	if err != nil {
		return err
	}
	defer bns.Close()
	err = netnsutil.Do(a.nsPath("net"), func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eth0"}, PeerName: "eth0-" + b.Suffix}
		if err := netlink.LinkAdd(veth); err != nil {
			return fmt.Errorf("add veth eth0 in node %s: %w", a.Name, err)
		}
		peer, err := netlink.LinkByName("eth0-" + b.Suffix)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetNsFd(peer, int(bns.Fd())); err != nil {
			return fmt.Errorf("move the veth's peer into node %s: %w", b.Name, err)
		}
		return nodeLink("eth0", a, b, "")
	})
	if err != nil {
		return err
	}
	return netnsutil.Do(b.nsPath("net"), func() error {
		return nodeLink("eth0-"+b.Suffix, b, a, serviceNet)
	})
}

// nodeLink runs in n's network namespace: it names the link eth0, gives it n's addresses (IPv6
// without duplicate address detection, which would only delay the node) and routes the peer's
// pod ranges, and extra, through the peer.
func nodeLink(name string, n, peer *Node, extra string) error {
	link, err := netlink.LinkByName(name)
	if err != nil {
		return err
	}
	if name != "eth0" {
		if err := netlink.LinkSetName(link, "eth0"); err != nil {
			return fmt.Errorf("node %s: rename %s to eth0: %w", n.Name, name, err)
		}
	}
	v6 := mustAddr(n.IPv6 + "/64")
	v6.Flags = syscall.IFA_F_NODAD
	for _, addr := range []*netlink.Addr{mustAddr(n.IPv4 + "/24"), v6} {
		if err := netlink.AddrAdd(link, addr); err != nil {
			return fmt.Errorf("node %s: add %s to eth0: %w", n.Name, addr, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("node %s: set eth0 up: %w", n.Name, err)
	}
	routes := map[string]string{peer.PodNet4: peer.IPv4, peer.PodNet6: peer.IPv6}
	if extra != "" {
		routes[extra] = peer.IPv4
	}
	for dst, via := range routes {
		_, ipnet, err := net.ParseCIDR(dst)
		if err != nil {
			return err
		}
		r := &netlink.Route{LinkIndex: link.Attrs().Index, Dst: ipnet, Gw: net.ParseIP(via)}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("node %s: route %s via %s: %w", n.Name, dst, via, err)
		}
	}
	return nil
}

// nsPath is the path of one of the node's namespaces, through the holder.
func (n *Node) nsPath(kind string) string {
	return fmt.Sprintf("/proc/%d/ns/%s", n.holder.Process.Pid, kind)
}

// Path is where a path of the node's mount namespace can be read from the machine.
func (n *Node) Path(p string) string {
	return fmt.Sprintf("/proc/%d/root%s", n.holder.Process.Pid, p)
}

// Command returns a command that runs inside the node's network and mount namespaces, with the
// runtime's binaries first on its PATH.
func (n *Node) Command(ctx context.Context, args ...string) *exec.Cmd {
	ns := []string{"--target", strconv.Itoa(n.holder.Process.Pid), "--mount", "--net", "--"}
	cmd := exec.CommandContext(ctx, "nsenter", append(ns, args...)...)
	cmd.Env = append(os.Environ(), "PATH="+n.c.Runtime.path())
	return cmd
}

// Run runs a command inside the node and returns its standard output; an error carries its
// standard error.
func (n *Node) Run(ctx context.Context, args ...string) (string, error) {
	cmd := n.Command(ctx, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("node %s: %s: %w: %s", n.Name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

// startProc starts a component in n's namespaces, logging to logs/<name>.log.
func (c *Cluster) startProc(n *Node, name, bin string, args ...string) (*proc, error) {
	logf, err := os.Create(filepath.Join(c.Dir, "logs", name+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := n.Command(context.Background(), append([]string{bin}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(cmd.Env, n.ownerMark())
	// nsenter execs the component in place, so the component itself dies with the test binary.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	c.procs = append(c.procs, p)
	return p, nil
}

// stop ends the process: SIGTERM, then SIGKILL after 15s. It returns once the process is reaped.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

func (n *Node) startContainerd() error {
	config := filepath.Join(n.c.Dir, "etc", "containerd-"+n.Suffix+".toml")
	if err := os.WriteFile(config, []byte(n.c.Runtime.containerdConfig()), 0o644); err != nil {
		return err
	}
	p, err := n.c.startProc(n, "containerd-"+n.Suffix, "containerd", "--config", config)
	if err != nil {
		return err
	}
	n.containerd = p
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := n.Run(context.Background(), "ctr", "version")
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("node %s: containerd exited: %v", n.Name, p.waitErr)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s: containerd not serving after 30s: %w", n.Name, err)
		}
	}
}

// RestartContainerd stops the node's containerd (SIGTERM, SIGKILL after 15s) and starts it again
// with its configuration. The shims, and so the pods' containers, keep running meanwhile, as on
// a node whose containerd unit restarts.
func (n *Node) RestartContainerd() error {
	n.containerd.stop()
	// startProc truncates the log: keep the first run's beside it.
	log := filepath.Join(n.c.Dir, "logs", "containerd-"+n.Suffix+".log")
	if err := os.Rename(log, log+".before-restart"); err != nil {
		return err
	}
	return n.startContainerd()
}

// waitReady waits for the Node object to report Ready.
func (n *Node) waitReady(kubelet *proc, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	for {
		ready, msg, err := n.Ready(ctx)
		if ready {
			return nil
		}
		last = msg
		if err != nil {
			last = err.Error()
		}
		select {
		case <-kubelet.exited:
			return fmt.Errorf("node %s: kubelet exited: %v", n.Name, kubelet.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready after %v: %s", n.Name, timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Ready returns the Node's Ready condition and its message.
func (n *Node) Ready(ctx context.Context) (bool, string, error) {
	node, err := n.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return false, "", err
	}
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			return cond.Status == corev1.ConditionTrue, fmt.Sprintf("Ready=%s: %s", cond.Status, cond.Message), nil
		}
	}
	return false, "no Ready condition", nil
}

// Stop stops the components, kills whatever the nodes still run (pods included), releases their
// namespaces and removes the cgroups. It is idempotent.
func (c *Cluster) Stop() error {
	if c.stopped {
		return nil
	}
	c.stopped = true
	var errs []error
	c.nodeMounts = map[string]bool{}
	host, _ := os.ReadFile("/proc/self/mountinfo")
	hostMounts := mountLines(string(host))
	for _, n := range c.Nodes {
		if n.holder == nil {
			continue
		}
		var pids []int
		n.podNetNS, pids = n.podNamespaces()
		for _, p := range append([]string{n.nsPath("net"), n.nsPath("mnt")}, nsPaths(pids)...) {
			if f, err := os.Open(p); err == nil {
				c.pins = append(c.pins, f)
			}
		}
		mi, _ := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", n.holder.Process.Pid))
		for _, m := range mountLines(string(mi)) {
			if !slices.Contains(hostMounts, m) {
				f := strings.Fields(m)
				c.nodeMounts[f[0]+" "+f[1]] = true
			}
		}
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		c.procs[i].stop()
	}
	if c.Control != nil {
		c.Control.Stop() // also releases its thread in node A's network namespace
	}
	for _, n := range c.Nodes {
		if n.holder == nil {
			continue
		}
		// Shims, pause and container processes outlive containerd: every process in the node's
		// namespaces or under its cgroup root was started for the node, and goes.
		if err := n.killRemaining(); err != nil {
			errs = append(errs, err)
		}
		n.holderIn.Close()
		if err := n.holder.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("node %s holder: %w", n.Name, err))
		}
	}
	if err := removeCgroups(c.CgroupRoot); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killRemaining SIGKILLs, by PID, every process other than the holder that belongs to the node,
// until none is left.
func (n *Node) killRemaining() error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		pids, err := n.processes()
		if err != nil {
			return err
		}
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes of node %s still running after SIGKILL: %v", n.Name, pids)
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// processes lists the node's processes, the holder excepted.
func (n *Node) processes() ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || (n.holder != nil && pid == n.holder.Process.Pid) || pid == os.Getpid() {
			continue
		}
		if n.owns(pid) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// podNamespaces returns the network namespaces of the node's processes other than the node's
// (and the machine's, which none should be in), each with a process in it.
func (n *Node) podNamespaces() ([]uint64, []int) {
	pids, _ := n.processes()
	host, _ := nsInode("/proc/self/ns/net")
	var nss []uint64
	var in []int
	for _, pid := range pids {
		if ino, err := nsInode(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && ino != n.NetNS && ino != host && !slices.Contains(nss, ino) {
			nss, in = append(nss, ino), append(in, pid)
		}
	}
	return nss, in
}

func nsPaths(pids []int) []string {
	var paths []string
	for _, pid := range pids {
		paths = append(paths, fmt.Sprintf("/proc/%d/ns/net", pid))
	}
	return paths
}

// ReleasePins lets the namespaces Stop pinned go; call it after the last Leftovers.
func (c *Cluster) ReleasePins() {
	for _, f := range c.pins {
		f.Close()
	}
	c.pins = nil
}

// owns tells whether a process belongs to the node: in one of its namespaces, in a cgroup under
// its cgroup root, or started with its owner's mark (containerd's shims inherit it). A node of a
// killed run (staleCluster) has no namespaces and no suffix: it owns what any of that run's nodes
// did.
func (n *Node) owns(pid int) bool {
	for kind, ino := range map[string]uint64{"net": n.NetNS, "mnt": n.MntNS} {
		if got, err := nsInode(fmt.Sprintf("/proc/%d/ns/%s", pid, kind)); err == nil && ino != 0 && got == ino {
			return true
		}
	}
	cg, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err == nil && (strings.Contains(string(cg), ":"+n.CgroupRoot+"/") || strings.Contains(string(cg), ":"+n.CgroupRoot+"\n")) {
		return true
	}
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	return err == nil && strings.Contains("\x00"+string(env), "\x00"+n.ownerMark())
}

// ownerEnv marks the processes a node starts with the PID of the test process that owns it and
// the node's suffix: E2E_NODE_OWNER=<pid>/<suffix>.
const ownerEnv = "E2E_NODE_OWNER"

func (n *Node) ownerMark() string {
	if n.Suffix == "" {
		return fmt.Sprintf("%s=%d/", ownerEnv, n.c.owner)
	}
	return fmt.Sprintf("%s=%d/%s", ownerEnv, n.c.owner, n.Suffix)
}

// RemoveStaleNodes ends the processes and removes the cgroups of clusters whose test process was
// killed before it could stop them (see staleOwners). Call it before reading the machine's state.
func RemoveStaleNodes(t testing.TB) {
	t.Helper()
	for _, owner := range staleOwners() {
		t.Logf("e2e: removing what the cluster of killed test process %d left behind", owner)
		c := newCluster(owner)
		any := &Node{c: c, CgroupRoot: c.CgroupRoot}
		if err := errors.Join(any.killRemaining(), removeCgroups(c.CgroupRoot)); err != nil {
			t.Fatalf("remove a killed run's cluster: %v", err)
		}
	}
}

// staleOwners finds the test processes that were killed before they could stop their cluster (a
// go test timeout, a SIGKILL): shims and containers outlive them, and so do the cgroups. They
// are known by the owner PID in their cgroup root's name and in their processes' environment; a
// run counts as stale only when that PID no longer runs.
func staleOwners() []int {
	owners := map[int]bool{}
	mps, _ := cgroupMounts()
	for _, mp := range mps {
		dirs, _ := filepath.Glob(filepath.Join(mp, "proxy-init-e2e-*"))
		for _, d := range dirs {
			if pid, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(d), "proxy-init-e2e-")); err == nil {
				owners[pid] = true
			}
		}
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		env, _ := os.ReadFile(p)
		for _, kv := range strings.Split(string(env), "\x00") {
			if v, ok := strings.CutPrefix(kv, ownerEnv+"="); ok {
				if pid, err := strconv.Atoi(strings.Split(v, "/")[0]); err == nil {
					owners[pid] = true
				}
			}
		}
	}
	var stale []int
	for pid := range owners {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			stale = append(stale, pid)
		}
	}
	return stale
}

// SetServiceIP adds or removes the "kubernetes" Service's IP on node A's lo: without it, pods
// and the CNI plugin on every node cannot reach the API server, while the kubelets and the
// control plane, which use 127.0.0.1 and node A's address, still can.
func (c *Cluster) SetServiceIP(present bool) error {
	return netnsutil.Do(c.A().nsPath("net"), func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		if present {
			err = netlink.AddrReplace(lo, mustAddr(serviceIPCIDR))
		} else {
			err = netlink.AddrDel(lo, mustAddr(serviceIPCIDR))
		}
		if err != nil {
			return fmt.Errorf("set %s on node A's lo to present=%v: %w", serviceIP, present, err)
		}
		return nil
	})
}

// Sysctls reads the node's view of KubeletSysctls: the files that cover them.
func (n *Node) Sysctls() (map[string]string, error) {
	vals := map[string]string{}
	for k := range KubeletSysctls {
		v, err := os.ReadFile(n.Path("/proc/sys/" + k))
		if err != nil {
			return nil, err
		}
		vals[k] = strings.TrimSpace(string(v))
	}
	return vals, nil
}

// ContainerdLog returns the node's containerd log so far; the CNI plugins' standard error is in it.
func (n *Node) ContainerdLog(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(n.c.Dir, "logs", "containerd-"+n.Suffix+".log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// logTails prints the end of every component's log.
func (c *Cluster) logTails(t testing.TB) {
	logs, _ := filepath.Glob(filepath.Join(c.Dir, "logs", "*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		t.Logf("--- %s (last %d lines) ---\n%s", filepath.Base(l), len(lines), strings.Join(lines, "\n"))
	}
}
