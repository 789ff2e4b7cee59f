package kubetest

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// DefaultBinDir is where test/kube/build.sh caches the binaries unless
// KUBE_BIN_CACHE says otherwise. It is outside the repository so that fresh
// clones on the same machine (CI) reuse one build.
const DefaultBinDir = "/var/cache/proxy-init-kube/bin"

// AutoBuildEnv, when set to 1, lets Start run test/kube/build.sh itself
// instead of failing when the binaries are missing or stale. It is off by
// default because a cold build takes longer than go test's default timeout.
const AutoBuildEnv = "KUBETEST_BUILD"

// BinDir returns the directory the cached kube-apiserver and etcd are read
// from: $KUBE_BIN_CACHE, else DefaultBinDir.
func BinDir() string {
	if d := os.Getenv("KUBE_BIN_CACHE"); d != "" {
		return d
	}
	return DefaultBinDir
}

// buildScript finds test/kube/build.sh: first next to this source file (the
// path the compiler recorded), then upwards from the working directory.
func buildScript() (string, bool) {
	const rel = "test/kube/build.sh"
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		p := filepath.Join(filepath.Dir(file), "..", "..", rel)
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", false
	}
	for {
		p := filepath.Join(dir, rel)
		if _, err := os.Stat(p); err == nil {
			return p, true
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", false
		}
		dir = parent
	}
}

// ensureBinaries checks that dir holds binaries built from the current
// test/kube sources, building them when AutoBuildEnv allows. explicit means
// the caller chose dir itself, and it is then trusted as it is.
func ensureBinaries(dir string, explicit bool, logf func(string, ...any)) error {
	missing := func() []string {
		var m []string
		for _, b := range []string{"kube-apiserver", "etcd"} {
			if fi, err := os.Stat(filepath.Join(dir, b)); err != nil || fi.Mode()&0o111 == 0 {
				m = append(m, b)
			}
		}
		return m
	}
	if explicit {
		if m := missing(); len(m) > 0 {
			return fmt.Errorf("%s missing in %s", strings.Join(m, " and "), dir)
		}
		return nil
	}
	script, ok := buildScript()
	if !ok {
		// Outside the repository: use what is there, since nothing can be
		// compared or built.
		if m := missing(); len(m) > 0 {
			return fmt.Errorf("%s missing in %s and test/kube/build.sh not found", strings.Join(m, " and "), dir)
		}
		return nil
	}
	check := exec.Command("bash", script, "--check")
	check.Env = append(os.Environ(), "KUBE_BIN_CACHE="+dir)
	out, err := check.CombinedOutput()
	if err == nil {
		return nil
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		return fmt.Errorf("%s --check: %w: %s", script, err, out)
	}
	if os.Getenv(AutoBuildEnv) != "1" {
		return fmt.Errorf("kube-apiserver/etcd test binaries are missing or stale in %s: "+
			"run `make kube-bins` (or %s), or set %s=1 to build them from the test (about 11 minutes cold)",
			dir, script, AutoBuildEnv)
	}
	logf("kubetest: building kube test binaries with %s (this can take about 11 minutes)", script)
	build := exec.Command("bash", script)
	build.Env = append(os.Environ(), "KUBE_BIN_CACHE="+dir)
	out, err = build.CombinedOutput()
	logf("%s", out)
	if err != nil {
		return fmt.Errorf("build kube test binaries: %w", err)
	}
	return nil
}
