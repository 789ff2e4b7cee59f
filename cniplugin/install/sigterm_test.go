package install

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/test/cnitest"
)

// TestSIGTERMRemovesEverything runs the real `linkerd-cni install` process, as the DaemonSet
// does, and sends it SIGTERM: it must exit 0 having restored every config file byte for byte
// and removed the kubeconfig and the binary, a config it could never parse included.
func TestSIGTERMRemovesEverything(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: builds cmd/linkerd-cni")
	}
	h := newHost(t)
	// The real binary replaces newHost's random stand-in.
	if err := os.Remove(filepath.Join(h.imageBin, "linkerd-cni")); err != nil {
		t.Fatal(err)
	}
	// As in the image: the node's plugin-only build in /opt/cni/bin, the full binary elsewhere.
	goBuild(t, h.imageBin, cnitest.NodeBinaries...)
	full := t.TempDir()
	goBuild(t, full, "github.com/kubemesh/proxy-init/cmd/linkerd-cni")
	h.write(t, "10-calico.conflist", calicoConflist)
	h.write(t, "20-flannel.conf", flannelConf)
	// A config nobody can parse (a trailing comma) is reported and never edited: removal is
	// clean all the same, and the exit code says so.
	const broken = `{"cniVersion":"0.3.1","name":"broken","plugins":[{"type":"bridge"},]}`
	h.write(t, "30-broken.conflist", broken)
	netBefore := dirNames(t, h.netDir)
	binBefore := dirNames(t, h.binDir)

	cmd := exec.Command(filepath.Join(full, "linkerd-cni"), "install", "--admin-addr=-", "--log-format=json")
	cmd.Env = []string{
		"CONTAINER_MOUNT_PREFIX=" + filepath.Join(h.root, "host"),
		"CONTAINER_CNI_BIN_DIR=" + h.imageBin,
		"SERVICE_ACCOUNT_PATH=" + h.saDir,
		"KUBERNETES_SERVICE_HOST=2001:db8::1",
		"KUBERNETES_SERVICE_PORT=443",
		"POD_NAMESPACE=linkerd-cni",
	}
	var stderr cnitest.SyncBuffer // read while the process writes
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	waitFor(t, 10*time.Second, "both files patched", func() (bool, string) {
		a, _ := os.ReadFile(filepath.Join(h.netDir, "10-calico.conflist"))
		b, _ := os.ReadFile(filepath.Join(h.netDir, "20-flannel.conflist"))
		return hasLinkerdLast(string(a)) && hasLinkerdLast(string(b)), stderr.String()
	})
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("installer exited with %v after SIGTERM\n%s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("installer still running 10s after SIGTERM\n%s", stderr.String())
	}
	if got := dirNames(t, h.netDir); !slices.Equal(got, netBefore) {
		t.Errorf("net dir after SIGTERM = %v, want %v", got, netBefore)
	}
	if got := dirNames(t, h.binDir); !slices.Equal(got, binBefore) {
		t.Errorf("bin dir after SIGTERM = %v, want %v", got, binBefore)
	}
	if h.read(t, "10-calico.conflist") != calicoConflist || h.read(t, "20-flannel.conf") != flannelConf || h.read(t, "30-broken.conflist") != broken {
		t.Error("config files not restored byte for byte")
	}
	if !strings.Contains(stderr.String(), "could not be parsed was left untouched") {
		t.Errorf("no warning about the unparsable config:\n%s", stderr.String())
	}
	if !strings.Contains(stderr.String(), `"msg":"uninstalled`) {
		t.Errorf("no uninstall log line:\n%s", stderr.String())
	}
}
