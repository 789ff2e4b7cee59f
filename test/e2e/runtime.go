package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Runtime is the container runtime the nodes run, chosen with E2E_RUNTIME.
type Runtime struct {
	// Name is containerd2 (the default) or containerd1.
	Name string
	// BinDir holds containerd, its shim, ctr and runc; it goes first on the PATH of every
	// process in the node. Empty for the machine's own (Debian's containerd 1.6 and runc 1.1).
	BinDir string
	// CNIVersion is the cniVersion of the node's bridge conflist: 1.1.0 on containerd 2, whose
	// libcni calls STATUS for it; containerd 1.6's libcni knows nothing newer than 1.0.0.
	CNIVersion string
	// UserNamespaces tells whether pods with hostUsers: false can run (containerd 2 with runc
	// 1.5 reports the CRI feature; containerd 1.6 cannot).
	UserNamespaces bool
}

// The runtimes E2E_RUNTIME names.
const (
	Containerd2 = "containerd2"
	Containerd1 = "containerd1"
)

// RuntimeFromEnv returns the runtime E2E_RUNTIME names (default containerd2). root is the
// repository: containerd 2 and runc come from test/e2e/runtime/build.sh's cache.
func RuntimeFromEnv(root string) (Runtime, error) {
	switch name := os.Getenv("E2E_RUNTIME"); name {
	case "", Containerd2:
		script := filepath.Join(root, "test/e2e/runtime/build.sh")
		if out, err := exec.Command(script, "--check").CombinedOutput(); err != nil {
			return Runtime{}, fmt.Errorf("%s", strings.TrimSpace(string(out)))
		}
		dir, err := exec.Command(script, "--print-dir").Output()
		if err != nil {
			return Runtime{}, fmt.Errorf("%s --print-dir: %w", script, err)
		}
		return Runtime{Name: Containerd2, BinDir: strings.TrimSpace(string(dir)), CNIVersion: "1.1.0", UserNamespaces: true}, nil
	case Containerd1:
		for _, b := range []string{"containerd", "containerd-shim-runc-v2", "ctr", "runc"} {
			if _, err := exec.LookPath(b); err != nil {
				return Runtime{}, fmt.Errorf("E2E_RUNTIME=containerd1 runs Debian's containerd and runc: %w (make e2e-deps)", err)
			}
		}
		return Runtime{Name: Containerd1, CNIVersion: "1.0.0"}, nil
	default:
		return Runtime{}, fmt.Errorf("E2E_RUNTIME=%q: want %s or %s", name, Containerd2, Containerd1)
	}
}

// path is the PATH of the node's processes.
func (r Runtime) path() string {
	if r.BinDir == "" {
		return os.Getenv("PATH")
	}
	return r.BinDir + ":" + os.Getenv("PATH")
}

// containerdConfig is containerd's configuration for this runtime.
func (r Runtime) containerdConfig() string {
	if r.Name == Containerd1 {
		return containerd1Config
	}
	return strings.ReplaceAll(containerd2Config, "@RUNC@", filepath.Join(r.BinDir, "runc"))
}
