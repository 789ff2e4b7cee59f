// Command linkerd-cni is the Linkerd-compatible chained CNI plugin. With CNI_COMMAND set (the
// container runtime calling it) it is the plugin; otherwise it runs a subcommand. All logic lives
// in package cniplugin and its sub-packages. Under one of Linkerd's names
// (linkerd-cni-repair-controller, linkerd2-cni-install; see package multicall) it runs that
// subcommand.
//
// Built with -tags pluginonly it is only the plugin (plus `version`): that is the binary the
// installer copies onto the node. Go runs the package initialisers of everything linked in on
// every start, and the installer's, agent's and repair controller's dependencies (client-go,
// informers, Prometheus, gRPC) would add tens of milliseconds to every pod's sandbox set-up. Both
// builds run the same plugin, whose API client is the standard library's.
//
// # Tests
//
// The lean plugin build links none of the DaemonSet's dependencies (TestPluginStaysLean), both
// builds are the same plugin (TestBothBuildsAreThePlugin), and Linkerd's names run what they run in
// Linkerd.
package main

import (
	"fmt"
	"os"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/internal/multicall"
)

func main() {
	if os.Getenv("CNI_COMMAND") != "" {
		cniplugin.PluginMain(cniplugin.NewNodePlugin())
	}
	args, err := multicall.Args(multicall.LinkerdCNI, os.Args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "linkerd-cni: "+err.Error())
		os.Exit(2)
	}
	if len(args) > 0 {
		if run, ok := subcommands[args[0]]; ok {
			os.Exit(run(args[1:]))
		}
	}
	os.Exit(cniplugin.Main(args, os.Stdout, os.Stderr))
}
