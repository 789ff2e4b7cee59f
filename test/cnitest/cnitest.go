// Package cnitest builds the CNI plugin binaries the linkerd-cni tests run through libcni and
// the end-to-end node runs under containerd: the real containernetworking bridge, host-local,
// loopback and portmap plugins at the version go.mod pins, and this checkout's own commands. It
// also holds SyncBuffer, the log sink the linkerd-cni components' tests read while they write.
//
// Limits: test support only (it runs `go build`, so it needs the Go toolchain and the module
// cache, never the network once the cache holds the modules). The containernetworking plugins
// are built once per version into a cache directory outside the repository, $CNI_PLUGINS_CACHE
// or /var/cache/proxy-init-cni, shared by every test binary and kept between runs.
package cnitest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

// PluginsModule is the module the real CNI plugins are built from.
const PluginsModule = "github.com/containernetworking/plugins"

// DefaultCache is where the plugins are cached when $CNI_PLUGINS_CACHE is not set.
const DefaultCache = "/var/cache/proxy-init-cni"

// pluginPkgs are the plugins a bridge conflist needs (and portmap, which kubelet-style
// conflists chain), by binary name. go.mod lists them as tools, so `go mod tidy` keeps the sums
// their build needs.
var pluginPkgs = map[string]string{
	"bridge":     PluginsModule + "/plugins/main/bridge",
	"host-local": PluginsModule + "/plugins/ipam/host-local",
	"loopback":   PluginsModule + "/plugins/main/loopback",
	"portmap":    PluginsModule + "/plugins/meta/portmap",
}

// NodeBinaries are the go build arguments of the binary the installer puts on the node, as
// `make build` builds it into bin/plugin: the plugin-only linkerd-cni (-tags pluginonly: none of
// the DaemonSet's subcommands).
var NodeBinaries = []string{"-tags=pluginonly", "github.com/kubemesh/proxy-init/cmd/linkerd-cni"}

// GoBuild builds into dir as `make build` builds the node's plugin: static (CGO_ENABLED=0),
// stripped and with trimmed paths. args are further go build flags (such as -tags=pluginonly,
// which builds linkerd-cni without the DaemonSet subcommands), then the packages. Each binary is
// then copied into dir as the installer copies the plugin onto a node (CopyAsInstalled).
func GoBuild(dir string, args ...string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil { // as go build -o dir/ would
		return err
	}
	tmp, err := os.MkdirTemp(dir, ".build-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	args = append([]string{"build", "-trimpath", "-ldflags", "-s -w", "-o", tmp + "/"}, args...)
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	built, err := os.ReadDir(tmp)
	for _, f := range built {
		if err == nil {
			err = CopyAsInstalled(filepath.Join(tmp, f.Name()), filepath.Join(dir, f.Name()))
		}
	}
	return err
}

// CopyAsInstalled copies the binary src to dst as the installer copies the plugin onto a node:
// read whole and written in one call. How a file was written decides how the kernel caches it
// (a file written in one call is held in large folios where the kernel can), and the linker's
// output started 0.3-0.8 ms slower than the same bytes written in one call on Linux 6.18 and ext4:
// a benchmark of start-ups measures its binaries as a node holds them.
func CopyAsInstalled(src, dst string) error {
	data, err := os.ReadFile(src)
	if err == nil {
		err = os.WriteFile(dst+".tmp", data, 0o755)
	}
	if err == nil {
		err = os.Rename(dst+".tmp", dst)
	}
	return err
}

// PluginsDir returns a directory holding the pluginPkgs plugins at the
// version go.mod pins, building them into the cache first if any is missing. Concurrent callers,
// in this process or another, are safe: each builds into a temporary directory and renames every
// binary into place whole, so nobody sees half of one, and losing that race is fine.
func PluginsDir() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", PluginsModule).Output()
	if err != nil {
		return "", fmt.Errorf("find the pinned version of %s: %w", PluginsModule, err)
	}
	cache := os.Getenv("CNI_PLUGINS_CACHE")
	if cache == "" {
		cache = DefaultCache
	}
	dir := filepath.Join(cache, "plugins-"+strings.TrimSpace(string(out)))
	have := func() bool {
		for name := range pluginPkgs {
			if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
				return false
			}
		}
		return true
	}
	if have() {
		return dir, nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", fmt.Errorf("create plugin cache: %w", err)
	}
	tmp, err := os.MkdirTemp(cache, ".build-")
	if err != nil {
		return "", fmt.Errorf("create plugin build directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	pkgs := make([]string, 0, len(pluginPkgs))
	for _, pkg := range pluginPkgs {
		pkgs = append(pkgs, pkg)
	}
	slices.Sort(pkgs) // a stable command line in errors
	if err := GoBuild(tmp, pkgs...); err != nil {
		return "", err
	}
	// Binary by binary, so a cache from before a plugin was added gains it.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create plugin directory: %w", err)
	}
	for name := range pluginPkgs {
		if err := os.Rename(filepath.Join(tmp, name), filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("install plugin %s into %s: %w", name, dir, err)
		}
	}
	return dir, nil
}
