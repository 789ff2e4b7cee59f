// Command linkerd-cni is the Linkerd-compatible chained CNI plugin. With CNI_COMMAND set (the
// container runtime calling it) it is the plugin; otherwise it runs a subcommand. All logic lives
// in package cniplugin.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/install"
	"github.com/kubemesh/proxy-init/cniplugin/repair"
)

func main() {
	if os.Getenv("CNI_COMMAND") != "" {
		skel.PluginMainFuncs(cniplugin.New().Funcs(), version.All, cniplugin.About)
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "install" {
		os.Exit(install.Main(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == "repair" {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := repair.Main(ctx, os.Args[2:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(cniplugin.Main(os.Args[1:], os.Stdout, os.Stderr))
}
