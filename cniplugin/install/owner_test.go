package install

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/kubemesh/proxy-init/test/netnstest"
)

// TestFilesOfOursAreRoots: the plugin binary and the kubeconfig (a token) end up root's, with our
// modes, even where a file of another owner stood before; the primary CNI's config keeps its own
// owner and mode when our entry goes in and out; temporary files a killed installer left are
// swept at start and at uninstall. (TestStandaloneConf holds the standalone file.)
func TestFilesOfOursAreRoots(t *testing.T) {
	netnstest.RequireRoot(t) // chown
	h := newHost(t)
	const primary = "10-calico.conflist"
	h.write(t, primary, `{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"calico"}]}`)
	for _, f := range []struct {
		path string
		mode os.FileMode
	}{
		{filepath.Join(h.netDir, primary), 0o640},
		{filepath.Join(h.binDir, "linkerd-cni"), 0o777},
		{filepath.Join(h.netDir, kubeconfigName), 0o666},
	} {
		if _, err := os.Stat(f.path); err != nil {
			if err := os.WriteFile(f.path, []byte("left by someone else\n"), f.mode); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(f.path, f.mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(f.path, 1000, 1001); err != nil {
			t.Fatal(err)
		}
	}
	// What a kill during a write leaves; one holds a token.
	leftovers := []string{filepath.Join(h.netDir, tmpPrefix+"123"), filepath.Join(h.binDir, tmpPrefix+"456")}
	for _, p := range leftovers {
		if err := os.WriteFile(p, []byte("token-0\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	r := h.start(t)
	r.waitReady(t)
	for _, p := range leftovers {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after start (%v)", p, err)
		}
	}
	check := func(when, path string, uid, gid uint32, mode os.FileMode) {
		t.Helper()
		checkOwner(t, when, path, uid, gid, mode)
	}
	check("installed", filepath.Join(h.binDir, "linkerd-cni"), 0, 0, 0o755)
	check("installed", filepath.Join(h.netDir, kubeconfigName), 0, 0, 0o600)
	check("installed", filepath.Join(h.netDir, primary), 1000, 1001, 0o640)
	if !hasLinkerdLast(h.read(t, primary)) {
		t.Fatalf("%s lacks our entry:\n%s", primary, h.read(t, primary))
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	check("uninstalled", filepath.Join(h.netDir, primary), 1000, 1001, 0o640)
	// Swept at uninstall too.
	if err := os.WriteFile(leftovers[0], nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r = h.start(t)
	r.waitReady(t)
	if err := os.WriteFile(leftovers[0], nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(leftovers[0]); !os.IsNotExist(err) {
		t.Errorf("%s left after uninstall (%v)", leftovers[0], err)
	}
}

func checkOwner(t *testing.T, when, path string, uid, gid uint32, mode os.FileMode) {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid != uid || st.Gid != gid || fi.Mode().Perm() != mode {
		t.Errorf("%s: %s is %d:%d mode %o, want %d:%d mode %o", when, path, st.Uid, st.Gid, fi.Mode().Perm(), uid, gid, mode)
	}
}
