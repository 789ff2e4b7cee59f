package main

import (
	"bytes"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/test/cnitest"
)

// TestPluginStaysLean guards the plugin's start-up: every package linked into a binary runs its
// initialisers on every start. The plugin the runtime runs on every pod's sandbox set-up (this
// command, -tags pluginonly) reads the API with the standard library's HTTPS client, and links no
// Kubernetes client library nor any of the DaemonSet's dependencies.
func TestPluginStaysLean(t *testing.T) {
	out, err := exec.Command("go", "list", "-tags", "pluginonly", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for _, want := range []string{"github.com/kubemesh/proxy-init/cniplugin", "net/http", "crypto/tls"} {
		if !slices.Contains(deps, want) {
			t.Errorf("the plugin does not link %s", want)
		}
	}
	forbidden := []string{
		"k8s.io/",                        // client-go, apimachinery, the API types, klog, the CRI's
		"sigs.k8s.io/",                   // apimachinery's JSON and YAML
		"github.com/fxamacker/cbor",      // apimachinery's CBOR codec
		"github.com/go-logr/",            // klog's
		"google.golang.org/protobuf/",    // client-go's
		"google.golang.org/grpc",         // the agent's CRI client
		"github.com/prometheus/",         // the DaemonSet's metrics
		"github.com/fsnotify/fsnotify",   // the installer's watches
		"github.com/vishvananda/netlink", // the tests' only: the policy routing uses jsimonetti/rtnetlink
		"github.com/kubemesh/proxy-init/cniplugin/agent",
		"github.com/kubemesh/proxy-init/cniplugin/install",
		"github.com/kubemesh/proxy-init/cniplugin/repair",
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("the plugin links %s", dep)
			}
		}
	}
}

// TestPluginRunsNoInitialiserOfOurs guards the other half of the plugin's start-up: what its
// packages compute before main. Go runs every linked package's initialisers at every start, for
// VERSION as for an ADD that the agent writes, so the tables of our packages the plugin links are
// switches, arrays and values filled on first use, never maps or calls in package variables. The
// runtime's own trace of its initialisers (GODEBUG=inittrace=1) lists every package that ran one.
func TestPluginRunsNoInitialiserOfOurs(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command: skipped with -short")
	}
	dir := t.TempDir()
	if err := cnitest.GoBuild(dir, cnitest.NodeBinaries...); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(dir, "linkerd-cni"))
	cmd.Env = []string{"CNI_COMMAND=VERSION", "GODEBUG=inittrace=1"}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("VERSION: %v\n%s", err, stderr.String())
	}
	traced := 0
	for _, line := range strings.Split(stderr.String(), "\n") {
		f := strings.Fields(line) // init <package> @<when> ms, <took> ms clock, ...
		if len(f) < 2 || f[0] != "init" {
			continue
		}
		traced++
		if f[1] == "main" || strings.HasPrefix(f[1], "github.com/kubemesh/proxy-init/") {
			t.Errorf("the plugin runs an initialiser of %s at every start: %s", f[1], line)
		}
	}
	if traced == 0 { // the trace itself is what this test reads
		t.Fatalf("GODEBUG=inittrace=1 traced no initialiser:\n%s", stderr.String())
	}
}

// TestDaemonSetLinksItsAPIGroupsOnly guards the DaemonSet binary's size (install, agent,
// repair): it links the three API groups it uses, through cniplugin/internal/kubeclient, and
// none of client-go's parts that register or generate code for every group (the Clientset and
// its scheme, the informer factory, the apply configurations, the fake clients behind client-go's
// generic typed client) or fetch OpenAPI documents.
func TestDaemonSetLinksItsAPIGroupsOnly(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	groups := []string{"k8s.io/api/core/v1", "k8s.io/api/apps/v1", "k8s.io/api/events/v1"}
	for _, want := range append([]string{"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"}, groups...) {
		if !slices.Contains(deps, want) {
			t.Errorf("the DaemonSet build does not link %s", want)
		}
	}
	forbidden := []string{
		"k8s.io/client-go/kubernetes", // the Clientset, its typed clients and scheme
		"k8s.io/client-go/informers",
		"k8s.io/client-go/applyconfigurations",
		"k8s.io/client-go/gentype",
		"k8s.io/client-go/testing",
		"k8s.io/client-go/discovery",
		"github.com/google/gnostic-models",
	}
	for _, dep := range deps {
		if strings.HasPrefix(dep, "k8s.io/api/") && !slices.Contains(groups, dep) {
			t.Errorf("the DaemonSet build links the API group %s", dep)
		}
		for _, f := range forbidden {
			if dep == f || strings.HasPrefix(dep, f+"/") {
				t.Errorf("the DaemonSet build links %s", dep)
			}
		}
	}
}
