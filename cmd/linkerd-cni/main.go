// Command linkerd-cni is the Linkerd-compatible chained CNI plugin when CNI_COMMAND is set, else
// it runs a subcommand (or, under one of Linkerd's names, that one; package multicall). All logic
// lives in package cniplugin and its sub-packages.
//
// Built with -tags pluginonly it is only the plugin (plus `version`), the binary copied onto the
// node: Go runs every linked package's initialisers on each start, and the DaemonSet's
// dependencies (client-go, Prometheus, gRPC) would add tens of milliseconds to every pod's set-up.
//
// # Tests
//
// The lean build links none of the DaemonSet's dependencies, both builds are the same plugin, and
// Linkerd's names run what they run in Linkerd.
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
		if run := subcommand(args[0]); run != nil {
			os.Exit(run(args[1:]))
		}
	}
	os.Exit(cniplugin.Main(args, os.Stdout, os.Stderr))
}
