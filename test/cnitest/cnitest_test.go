package cnitest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPluginsDir builds the plugins into an empty cache, then finds them there without building.
func TestPluginsDir(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: builds the containernetworking plugins")
	}
	cache := t.TempDir()
	t.Setenv("CNI_PLUGINS_CACHE", cache)
	dir, err := PluginsDir()
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(dir) != cache || !strings.HasPrefix(filepath.Base(dir), "plugins-v") {
		t.Fatalf("PluginsDir() = %s, want %s/plugins-<version>", dir, cache)
	}
	for name := range pluginPkgs {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.Mode().Perm()&0o100 == 0 {
			t.Fatalf("plugin %s: %v, mode %v; want an executable", name, err, fi.Mode())
		}
	}
	entries, err := os.ReadDir(cache)
	if err != nil || len(entries) != 1 {
		t.Fatalf("cache holds %v (err %v), want only %s: the build directory must be gone", entries, err, filepath.Base(dir))
	}
	// A second call finds the cache complete: it must not rebuild (the binaries keep their inode).
	before, _ := os.Stat(filepath.Join(dir, "bridge"))
	again, err := PluginsDir()
	if err != nil || again != dir {
		t.Fatalf("second PluginsDir() = %s, %v; want %s", again, err, dir)
	}
	if after, err := os.Stat(filepath.Join(dir, "bridge")); err != nil || !os.SameFile(before, after) {
		t.Fatalf("second PluginsDir() replaced the cached bridge plugin (err %v)", err)
	}
	// A cache written before a plugin joined the list gains it.
	if err := os.Remove(filepath.Join(dir, "portmap")); err != nil {
		t.Fatal(err)
	}
	if again, err := PluginsDir(); err != nil || again != dir {
		t.Fatalf("PluginsDir() over a cache without portmap = %s, %v; want %s", again, err, dir)
	}
	if _, err := os.Stat(filepath.Join(dir, "portmap")); err != nil {
		t.Fatalf("portmap not added to an older cache: %v", err)
	}
}

func TestGoBuildReportsFailure(t *testing.T) {
	err := GoBuild(t.TempDir(), "github.com/kubemesh/proxy-init/no/such/package")
	if err == nil || !strings.Contains(err.Error(), "no/such/package") {
		t.Fatalf("GoBuild of a missing package = %v, want an error naming it", err)
	}
}
