// Command linkerd-cni is the Linkerd-compatible chained CNI plugin. With CNI_COMMAND set (the
// container runtime calling it) it is the plugin; otherwise it runs a subcommand. All logic lives
// in package cniplugin.
package main

import (
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/install"
)

func main() {
	if os.Getenv("CNI_COMMAND") != "" {
		skel.PluginMainFuncs(cniplugin.New().Funcs(), version.All, cniplugin.About)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "install" {
		os.Exit(install.Main(os.Args[2:]))
	}
	os.Exit(cniplugin.Main(os.Args[1:], os.Stdout, os.Stderr))
}
