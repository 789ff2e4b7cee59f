// Command linkerd-cni is the Linkerd-compatible chained CNI plugin. With CNI_COMMAND set (the
// container runtime calling it) it is the plugin; otherwise it runs a subcommand. All logic lives
// in package cniplugin and its sub-packages.
//
// Built with -tags pluginonly it is only the plugin (plus `version`): that is the binary the
// installer copies onto the node. Go runs the package initialisers of everything linked in on
// every start, and the installer's and repair controller's dependencies (client-go's full
// clientset, informers, Prometheus) would add tens of milliseconds to every pod's sandbox set-up.
package main

import (
	"os"

	"github.com/kubemesh/proxy-init/cniplugin"
)

func main() {
	if os.Getenv("CNI_COMMAND") != "" {
		cniplugin.PluginMain()
	}
	if len(os.Args) > 1 {
		if run, ok := subcommands[os.Args[1]]; ok {
			os.Exit(run(os.Args[2:]))
		}
	}
	os.Exit(cniplugin.Main(os.Args[1:], os.Stdout, os.Stderr))
}
