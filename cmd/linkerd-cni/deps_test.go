package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// daemonSetDeps are the DaemonSet's dependencies, which neither binary on the node links.
var daemonSetDeps = []string{
	"k8s.io/api/",                  // the API types: their scheme and protobuf code
	"k8s.io/client-go/kubernetes",  // the clientset and its scheme of every API group
	"k8s.io/client-go/informers",   // the repair controller's
	"github.com/prometheus/",       // the repair controller's metrics
	"github.com/fsnotify/fsnotify", // the installer's watches
	"google.golang.org/grpc",       // the agent's CRI client
	"k8s.io/cri-api/",              // the CRI's types
}

// TestNodeBinariesStayLean guards the plugin's start-up: every package linked into a binary runs
// its initialisers on every start. The plugin the runtime runs on every pod's sandbox set-up (this
// command, -tags pluginonly) links no Kubernetes client at all, nor Go's HTTPS stack; its
// companion (cmd/linkerd-cni-api), which it runs only to read the API, links client-go's REST
// client but none of the DaemonSet's dependencies.
func TestNodeBinariesStayLean(t *testing.T) {
	tests := []struct {
		name      string
		args      []string
		required  string // what the binary is for
		forbidden []string
	}{
		{"plugin", []string{"-tags", "pluginonly", "."}, "github.com/kubemesh/proxy-init/cniplugin", append([]string{
			"k8s.io/",                     // client-go, apimachinery, klog, utils
			"sigs.k8s.io/",                // apimachinery's JSON and YAML
			"github.com/fxamacker/cbor",   // apimachinery's CBOR codec
			"github.com/go-logr/",         // klog's
			"google.golang.org/protobuf/", // client-go's
			"net/http",                    // what any client of the API links
			"crypto/tls",
			"github.com/kubemesh/proxy-init/cniplugin/kubeapi",
		}, daemonSetDeps...)},
		{"companion", []string{"../linkerd-cni-api"}, "github.com/kubemesh/proxy-init/cniplugin/kubeapi", append([]string{
			"github.com/kubemesh/proxy-init/cniplugin/agent",
			"github.com/kubemesh/proxy-init/cniplugin/install",
			"github.com/kubemesh/proxy-init/cniplugin/repair",
		}, daemonSetDeps...)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := exec.Command("go", append([]string{"list", "-deps"}, tt.args...)...).CombinedOutput()
			if err != nil {
				t.Fatalf("go list: %v\n%s", err, out)
			}
			deps := strings.Fields(string(out))
			if len(deps) < 10 {
				t.Fatalf("go list printed %d packages, not a dependency list:\n%s", len(deps), out)
			}
			if !slices.Contains(deps, tt.required) {
				t.Errorf("the %s does not link %s", tt.name, tt.required)
			}
			for _, dep := range deps {
				for _, f := range tt.forbidden {
					if strings.HasPrefix(dep, f) {
						t.Errorf("the %s links %s", tt.name, dep)
					}
				}
			}
		})
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
