package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPluginOnlyBuildStaysLean guards the plugin's start-up: every package linked into the node's
// copy runs its initialisers on every pod's sandbox set-up, so the API types, the clientset and
// the DaemonSet's dependencies must stay out of the pluginonly build.
func TestPluginOnlyBuildStaysLean(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "pluginonly", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	forbidden := []string{
		"k8s.io/api/",                  // the API types: their scheme and protobuf code
		"k8s.io/client-go/kubernetes",  // the clientset and its scheme of every API group
		"k8s.io/client-go/informers",   // the repair controller's
		"github.com/prometheus/",       // the repair controller's metrics
		"github.com/fsnotify/fsnotify", // the installer's watches
		"google.golang.org/grpc",       // the agent's CRI client
		"k8s.io/cri-api/",              // the CRI's types
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list printed %d packages, not a dependency list:\n%s", len(deps), out)
	}
	for _, dep := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("the pluginonly build links %s", dep)
			}
		}
	}
}
