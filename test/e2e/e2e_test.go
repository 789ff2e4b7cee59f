//go:build e2e

package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/kubemesh/proxy-init/test/netnstest"
)

func TestMain(m *testing.M) {
	HolderMain()
	os.Exit(m.Run())
}

// repoRoot is the repository's root; go test runs in the package's directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// kubeNodeBinary returns the cached kube-node, failing the test when it is missing or stale.
func kubeNodeBinary(t testing.TB) string {
	t.Helper()
	script := filepath.Join(repoRoot(t), "test/e2e/kube/build.sh")
	if out, err := exec.Command(script, "--check").CombinedOutput(); err != nil {
		t.Fatalf("%s (run `make kube-node`)", strings.TrimSpace(string(out)))
	}
	dir, err := exec.Command(script, "--print-dir").Output()
	if err != nil {
		t.Fatalf("%s --print-dir: %v", script, err)
	}
	return filepath.Join(strings.TrimSpace(string(dir)), "kube-node")
}

// nextImage is the linkerd-cni image of a second build, with another tag: RollingUpgrade's
// image B.
var nextImage string

// ourImages maps the repositories of the project's images to the names `make images` gave them
// (the build's tag), for the manifests in deploy/, which name a release.
var ourImages = map[string]string{}

// useOurImages points a container that runs one of our images at this build's.
func useOurImages(c *corev1.Container) {
	if i := strings.LastIndex(c.Image, ":"); i > 0 && ourImages[c.Image[:i]] != "" {
		c.Image = ourImages[c.Image[:i]]
	}
}

// TestE2E starts the cluster (E2E_RUNTIME picks its runtime) and runs every scenario on it as
// a subtest, then stops it and checks that nothing of it is left on the machine. Run one
// scenario alone with -run 'TestE2E/<Name>$'.
func TestE2E(t *testing.T) {
	netnstest.RequireRoot(t)
	RemoveStaleNodes(t)
	before, err := ReadHostState()
	if err != nil {
		t.Fatal(err)
	}
	c := startE2ECluster(t)
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, c) })
	}

	// What the checks below see of the running cluster, to show they would see a leak.
	running, runErr := c.Leftovers()
	var sysctls []map[string]string
	var sysErr error
	for _, n := range c.Nodes {
		s, err := n.Sysctls()
		sysctls, sysErr = append(sysctls, s), errors.Join(sysErr, err)
	}
	if err := c.Stop(); err != nil {
		t.Errorf("stop the cluster: %v", err)
	}
	check := func(t *testing.T) {
		if runErr != nil || sysErr != nil {
			t.Fatal(runErr, sysErr)
		}
		for _, n := range c.Nodes {
			if !slices.ContainsFunc(running, func(l string) bool { return strings.Contains(l, n.Name) }) {
				t.Errorf("Leftovers found nothing of running node %s: it would miss a leak", n.Name)
			}
		}
		for i, n := range c.Nodes {
			for k, want := range KubeletSysctls {
				if sysctls[i][k] != want {
					t.Errorf("node %s's %s is %q, want the kubelet's %q: the kubelet did not write into the node's cover", n.Name, k, sysctls[i][k], want)
				}
			}
		}
		left, err := c.Leftovers()
		if err != nil {
			t.Fatal(err)
		}
		after, err := ReadHostState()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range append(left, before.Diff(after, c.OursMount)...) {
			t.Error(l)
		}
	}
	checked := false
	t.Run("NothingLeftOnHost", func(t *testing.T) { checked = true; check(t) })
	if !checked { // -run left the subtest out; the machine is checked all the same
		check(t)
	}
}

// startE2ECluster builds the test images, starts the cluster on the runtime E2E_RUNTIME names
// with our images imported, and keeps its logs under E2E_LOGS when that is set.
func startE2ECluster(t *testing.T) *Cluster {
	root := repoRoot(t)
	images, err := BuildTestImages(root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"linkerd-cni", "proxy-init"} {
		archive := filepath.Join(root, "bin/images", name+".tar")
		ref, err := ArchiveRef(archive)
		if err != nil {
			t.Fatalf("%v (run `make images`)", err)
		}
		ourImages[ref[:strings.LastIndex(ref, ":")]] = ref
		images = append(images, archive)
	}
	next, nextRef, err := BuildNextImage(root, t.TempDir(), ourImages["ghcr.io/kubemesh/linkerd-cni"])
	if err != nil {
		t.Fatal(err)
	}
	images, nextImage = append(images, next), nextRef
	rt, err := RuntimeFromEnv(root)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{KubeNode: kubeNodeBinary(t), Runtime: rt, Images: images}
	if dir := os.Getenv("E2E_LOGS"); dir != "" {
		if opts.Dir, err = os.MkdirTemp(dir, "cluster-"); err != nil {
			t.Fatal(err)
		}
		t.Logf("cluster configuration and logs kept in %s", opts.Dir)
	}
	return StartCluster(t, opts)
}

// scenarios run in this order on one cluster, each a subtest of TestE2E; each sets up what it
// needs, so any one runs alone.
var scenarios = []struct {
	name string
	run  func(*testing.T, *Cluster)
}{
	{"DaemonSet", testDaemonSet},
	{"NodeLeavesDaemonSet", testNodeLeavesDaemonSet},
	{"MeshedPod", testMeshedPod},
	{"InitContainerPod", testInitContainerPod},
	{"UnmeshedPods", testUnmeshedPods},
	{"Repair", testRepair},
	{"AgentHealsInPlace", testAgentHealsInPlace},
	{"AgentDrift", testAgentDrift},
	{"AgentLookup", testAgentLookup},
	{"KubeletLookup", testKubeletLookup},
	{"PluginKubeletLookup", testPluginKubeletLookup},
	{"PluginLogs", testPluginLogs},
	{"Teardown", testTeardown},
	{"DualStack", testDualStack},
	{"CrossNode", testCrossNode},
	{"RepairScope", testRepairScope},
	{"JobValidatorRestart", testJobValidatorRestart},
	{"UserNamespacePod", testUserNamespacePod},
	{"LinkerdInjected", testLinkerdInjected},
	{"Status", testStatus},
	{"RollingUpgrade", testRollingUpgrade},
	{"Load", testLoad},
	{"Chaos", testChaos},
	{"APIUnreachable", testAPIUnreachable},
}
