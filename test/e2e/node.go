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

	"github.com/kubemesh/proxy-init/internal/cnitest"
	"github.com/kubemesh/proxy-init/internal/kubetest"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
)

// NodeName is the name the kubelet registers.
const NodeName = "e2e-node"

// Options configures StartNode.
type Options struct {
	// KubeNode is the kube-node binary (test/e2e/kube): kube-controller-manager, kube-scheduler
	// and kubelet.
	KubeNode string
	// Images are OCI tarballs imported into containerd's k8s.io namespace before the kubelet
	// starts; the pause image among them.
	Images []string
	// ReadyTimeout bounds the wait for the Node to be Ready. Default 3 minutes.
	ReadyTimeout time.Duration
	// Dir, when set, receives the configurations and logs, and is kept; by default they go to
	// a temporary directory that is removed with the test.
	Dir string
}

// Node is a running single-node cluster.
type Node struct {
	// Dir holds the configurations and logs, on the machine's filesystem.
	Dir string
	// Cluster is the API server and etcd; Client is its admin client.
	Cluster *kubetest.Cluster
	Client  kubernetes.Interface
	// CgroupRoot is the kubelet's cgroup root, the same path in every hierarchy.
	CgroupRoot string
	// NetNS and MntNS are the inodes of the node's namespaces.
	NetNS, MntNS uint64

	owner    int // the test process's PID
	holder   *exec.Cmd
	holderIn io.Closer
	procs    []*proc  // in start order
	podNetNS []uint64 // pods' network namespaces seen at Stop, for Leftovers
	stopped  bool
}

// proc is a process started in the node's namespaces.
type proc struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
}

// StartNode builds the node, starts every component and waits until the Node is Ready. t.Cleanup
// stops it, if Stop has not already.
func StartNode(t testing.TB, opts Options) *Node {
	t.Helper()
	if opts.ReadyTimeout == 0 {
		opts.ReadyTimeout = 3 * time.Minute
	}
	n := newNode(os.Getpid())
	n.Dir = opts.Dir
	if n.Dir == "" {
		n.Dir = t.TempDir()
	}
	t.Cleanup(func() {
		if t.Failed() {
			n.logTails(t)
		}
		if err := n.Stop(); err != nil {
			t.Errorf("stop node: %v", err)
		}
	})
	if err := n.start(t, opts); err != nil {
		t.Fatalf("start node: %v", err)
	}
	return n
}

func (n *Node) start(t testing.TB, opts Options) error {
	began := time.Now()
	for _, d := range []string{"logs", "etc"} {
		if err := os.MkdirAll(filepath.Join(n.Dir, d), 0o755); err != nil {
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
	n.holder, n.holderIn, err = startHolder(holderSpec{
		HostNetNS: hostNet, HostMntNS: hostMnt, PluginsDir: plugins, Conflist: bridgeConflist,
	}, filepath.Join(n.Dir, "logs", "holder.log"))
	if err != nil {
		return err
	}
	if n.NetNS, err = nsInode(n.nsPath("net")); err != nil {
		return err
	}
	if n.MntNS, err = nsInode(n.nsPath("mnt")); err != nil {
		return err
	}
	if err := n.makeCgroups(); err != nil {
		return err
	}

	n.Cluster = kubetest.Start(t, kubetest.Options{
		NetNSPath:               n.nsPath("net"),
		BindAddress:             "0.0.0.0",
		SecurePort:              443,
		ServingIPs:              []net.IP{net.ParseIP(nodeIP), net.ParseIP(serviceIP)},
		ServiceAccountAdmission: true,
		ExtraAPIServerArgs: []string{
			"--service-cluster-ip-range=" + serviceNet,
			"--advertise-address=" + nodeIP,
		},
	})
	n.Client = n.Cluster.Clientset
	kubeconfig := filepath.Join(n.Dir, "etc", "admin.kubeconfig")
	if err := n.Cluster.WriteAdminKubeconfig(kubeconfig); err != nil {
		return err
	}

	if err := n.startContainerd(); err != nil {
		return err
	}
	for _, img := range opts.Images {
		if _, err := n.Run(context.Background(), "ctr", "-n", "k8s.io", "images", "import", img); err != nil {
			return fmt.Errorf("import image %s: %w", img, err)
		}
	}

	if _, err := n.startProc("kube-controller-manager", opts.KubeNode, "kube-controller-manager",
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--root-ca-file="+n.Cluster.CAFile,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
		"--use-service-account-credentials=false",
	); err != nil {
		return err
	}
	if _, err := n.startProc("kube-scheduler", opts.KubeNode, "kube-scheduler",
		"--kubeconfig="+kubeconfig,
		"--authentication-kubeconfig="+kubeconfig,
		"--authorization-kubeconfig="+kubeconfig,
		"--leader-elect=false",
		"--bind-address=127.0.0.1",
	); err != nil {
		return err
	}
	kubeletConfig := filepath.Join(n.Dir, "etc", "kubelet.yaml")
	if err := os.WriteFile(kubeletConfig, []byte(fmt.Sprintf(kubeletConfigTmpl, n.CgroupRoot)), 0o644); err != nil {
		return err
	}
	kubelet, err := n.startProc("kubelet", opts.KubeNode, "kubelet",
		"--config="+kubeletConfig,
		"--kubeconfig="+kubeconfig,
		"--root-dir=/var/lib/kubelet",
		"--hostname-override="+NodeName,
		"--node-ip="+nodeIP,
		"--v=2",
	)
	if err != nil {
		return err
	}
	if err := n.waitReady(kubelet, opts.ReadyTimeout); err != nil {
		return err
	}
	t.Logf("e2e: node %s Ready in %v (dir %s, holder pid %d, cgroup root %s)",
		NodeName, time.Since(began).Round(time.Millisecond), n.Dir, n.holder.Process.Pid, n.CgroupRoot)
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

// Command returns a command that runs inside the node's network and mount namespaces.
func (n *Node) Command(ctx context.Context, args ...string) *exec.Cmd {
	ns := []string{"--target", strconv.Itoa(n.holder.Process.Pid), "--mount", "--net", "--"}
	return exec.CommandContext(ctx, "nsenter", append(ns, args...)...)
}

// Run runs a command inside the node and returns its standard output; an error carries its
// standard error.
func (n *Node) Run(ctx context.Context, args ...string) (string, error) {
	cmd := n.Command(ctx, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func (n *Node) startProc(name, bin string, args ...string) (*proc, error) {
	logf, err := os.Create(filepath.Join(n.Dir, "logs", name+".log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := n.Command(context.Background(), append([]string{bin}, args...)...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), strings.TrimSuffix(n.ownerMark(), "\x00"))
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
	n.procs = append(n.procs, p)
	return p, nil
}

func (n *Node) startContainerd() error {
	config := filepath.Join(n.Dir, "etc", "containerd.toml")
	if err := os.WriteFile(config, []byte(containerdConfig), 0o644); err != nil {
		return err
	}
	p, err := n.startProc("containerd", "containerd", "--config", config)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := n.Run(context.Background(), "ctr", "version")
		if err == nil {
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("containerd exited: %v", p.waitErr)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("containerd not serving after 30s: %w", err)
		}
	}
}

// waitReady waits for the Node object to report Ready.
func (n *Node) waitReady(kubelet *proc, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last string
	for {
		node, err := n.Client.CoreV1().Nodes().Get(ctx, NodeName, metav1.GetOptions{})
		if err == nil {
			last = "no Ready condition"
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady {
					if c.Status == corev1.ConditionTrue {
						return nil
					}
					last = fmt.Sprintf("Ready=%s: %s", c.Status, c.Message)
				}
			}
		} else {
			last = err.Error()
		}
		select {
		case <-kubelet.exited:
			return fmt.Errorf("kubelet exited: %v", kubelet.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("node %s not Ready after %v: %s", NodeName, timeout, last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// Stop stops the components, kills whatever the node still runs (pods included), releases its
// namespaces and removes its cgroups. It is idempotent.
func (n *Node) Stop() error {
	if n.stopped {
		return nil
	}
	n.stopped = true
	var errs []error
	if n.holder != nil {
		n.podNetNS = n.podNamespaces()
	}
	for i := len(n.procs) - 1; i >= 0; i-- {
		p := n.procs[i]
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.exited:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.exited
		}
	}
	if n.Cluster != nil {
		n.Cluster.Stop() // also releases its thread in the node's network namespace
	}
	if n.holder != nil {
		// Shims, pause and container processes outlive containerd: every process in the node's
		// namespaces or under its cgroup root was started for the node, and goes.
		if err := n.killRemaining(); err != nil {
			errs = append(errs, err)
		}
		n.holderIn.Close()
		if err := n.holder.Wait(); err != nil {
			errs = append(errs, fmt.Errorf("node holder: %w", err))
		}
	}
	if err := n.removeCgroups(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// killRemaining SIGKILLs, by PID, every process other than the holder that is in the node's
// namespaces or cgroups, until none is left.
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
			return fmt.Errorf("processes of the node still running after SIGKILL: %v", pids)
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
// (and the machine's, which none should be in).
func (n *Node) podNamespaces() []uint64 {
	pids, _ := n.processes()
	host, _ := nsInode("/proc/self/ns/net")
	var nss []uint64
	for _, pid := range pids {
		if ino, err := nsInode(fmt.Sprintf("/proc/%d/ns/net", pid)); err == nil && ino != n.NetNS && ino != host && !slices.Contains(nss, ino) {
			nss = append(nss, ino)
		}
	}
	return nss
}

// owns tells whether a process belongs to the node: in one of its namespaces, in a cgroup under
// its cgroup root, or started with its owner's mark (containerd's shims inherit it).
func (n *Node) owns(pid int) bool {
	for kind, ino := range map[string]uint64{"net": n.NetNS, "mnt": n.MntNS} {
		if got, err := nsInode(fmt.Sprintf("/proc/%d/ns/%s", pid, kind)); err == nil && got == ino {
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

// ownerEnv marks the processes a node starts with the PID of the test process that owns it.
const ownerEnv = "E2E_NODE_OWNER"

func (n *Node) ownerMark() string { return ownerEnv + "=" + strconv.Itoa(n.owner) + "\x00" }

func newNode(owner int) *Node {
	return &Node{owner: owner, CgroupRoot: fmt.Sprintf("/proxy-init-e2e-%d", owner)}
}

// RemoveStaleNodes ends the processes and removes the cgroups of nodes whose test process was
// killed before it could stop them (see staleNodes). Call it before reading the machine's state.
func RemoveStaleNodes(t testing.TB) {
	t.Helper()
	for _, stale := range staleNodes() {
		t.Logf("e2e: removing what the node of killed test process %d left behind", stale.owner)
		if err := errors.Join(stale.killRemaining(), stale.removeCgroups()); err != nil {
			t.Fatalf("remove a killed run's node: %v", err)
		}
	}
}

// staleNodes finds nodes whose test process was killed before it could stop them (a go test
// timeout, a SIGKILL): shims and containers outlive it, and so do the cgroups. They are known by
// the owner PID in their cgroup root's name and in their processes' environment; a node counts
// as stale only when that PID no longer runs.
func staleNodes() []*Node {
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
			if pid, err := strconv.Atoi(strings.TrimPrefix(kv, ownerEnv+"=")); err == nil && strings.HasPrefix(kv, ownerEnv+"=") {
				owners[pid] = true
			}
		}
	}
	var stale []*Node
	for pid := range owners {
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); os.IsNotExist(err) {
			stale = append(stale, newNode(pid))
		}
	}
	return stale
}

// SetServiceIP adds or removes the "kubernetes" Service's IP on the node's lo: without it, pods
// and the CNI plugin cannot reach the API server, while the kubelet and the control plane, which
// use 127.0.0.1, still can.
func (n *Node) SetServiceIP(present bool) error {
	return netnsutil.Do(n.nsPath("net"), func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		addr, err := netlink.ParseAddr(serviceIP + "/32")
		if err != nil {
			return err
		}
		if present {
			err = netlink.AddrReplace(lo, addr)
		} else {
			err = netlink.AddrDel(lo, addr)
		}
		if err != nil {
			return fmt.Errorf("set %s on the node's lo to present=%v: %w", serviceIP, present, err)
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

// ContainerdLog returns containerd's log so far; the CNI plugins' standard error is in it.
func (n *Node) ContainerdLog(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(n.Dir, "logs", "containerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// logTails prints the end of every component's log.
func (n *Node) logTails(t testing.TB) {
	logs, _ := filepath.Glob(filepath.Join(n.Dir, "logs", "*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
		if len(lines) > 40 {
			lines = lines[len(lines)-40:]
		}
		t.Logf("--- %s (last %d lines) ---\n%s", filepath.Base(l), len(lines), strings.Join(lines, "\n"))
	}
}
