//go:build e2e

package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/internal/netnstest"
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

// TestE2E starts one node and runs every scenario on it as a subtest, then stops the node and
// checks that nothing of it is left on the machine. Run one scenario alone with
// -run 'TestE2E/<Name>$'.
func TestE2E(t *testing.T) {
	netnstest.RequireRoot(t)
	root := repoRoot(t)
	before, err := ReadHostState()
	if err != nil {
		t.Fatal(err)
	}
	images, err := BuildTestImages(root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	project, err := BuildProjectImages(root, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	n := StartNode(t, Options{KubeNode: kubeNodeBinary(t), Images: append(images, project...)})
	for _, sc := range []struct {
		name string
		run  func(*testing.T, *Node)
	}{
		{"DaemonSet", testDaemonSet},
		{"MeshedPod", testMeshedPod},
		{"InitContainerPod", testInitContainerPod},
		{"UnmeshedPods", testUnmeshedPods},
		{"Repair", testRepair},
		{"Teardown", testTeardown},
		{"Load", testLoad},
		{"APIUnreachable", testAPIUnreachable},
	} {
		t.Run(sc.name, func(t *testing.T) { sc.run(t, n) })
	}

	if err := n.Stop(); err != nil {
		t.Errorf("stop the node: %v", err)
	}
	t.Run("NothingLeftOnHost", func(t *testing.T) {
		left, err := n.Leftovers()
		if err != nil {
			t.Fatal(err)
		}
		after, err := ReadHostState()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range append(left, before.Diff(after)...) {
			t.Error(l)
		}
	})
}
