package cniplugin

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kubemesh/proxy-init/internal/buildinfo"
)

// PluginMain runs p as the container runtime runs the plugin (CNI_COMMAND set), and exits. It is
// skel's main, except that DEL never fails: skel refuses a config it cannot read (empty, not
// JSON, an unknown cniVersion) before our Del runs, and a failing DEL blocks the sandbox's
// teardown forever, while our rules die with the pod's namespace anyway.
func PluginMain(p *Plugin) {
	p.started = time.Now()
	err := skel.PluginMainFuncsWithError(p.Funcs(), version.All, about())
	if err == nil {
		os.Exit(0)
	}
	if os.Getenv("CNI_COMMAND") == "DEL" {
		fmt.Fprintf(os.Stderr, "linkerd-cni: DEL of container %q: %v; nothing removed (the rules go with the pod's network namespace)\n",
			os.Getenv("CNI_CONTAINERID"), err)
		os.Exit(0)
	}
	if perr := err.Print(); perr != nil {
		fmt.Fprintf(os.Stderr, "linkerd-cni: write the error result: %v\n", perr)
	}
	os.Exit(1)
}

const usage = `usage: linkerd-cni <command>

As a CNI plugin, linkerd-cni is run by the container runtime with CNI_COMMAND set.
Commands:
  version   print the build information
  install   install the plugin on this node and keep it installed (the DaemonSet's install-cni)
  agent     the node agent: pod lookups for the plugin, audits and in-place repair of every meshed pod
  repair    restart pods that started before the plugin was ready on their node
`

// Main runs the linkerd-cni subcommands of this package (install, agent and repair are their
// packages') and returns the exit code: 0 on success, 2 for a usage error.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "version", "--version":
		fmt.Fprintln(stdout, "linkerd-cni "+buildinfo.Get().String())
		return 0
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "linkerd-cni: unknown command %q\n\n%s", args[0], usage)
	return 2
}
