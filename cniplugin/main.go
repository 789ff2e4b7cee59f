package cniplugin

import (
	"fmt"
	"io"

	"github.com/kubemesh/proxy-init/internal/buildinfo"
)

const usage = `usage: linkerd-cni <command>

As a CNI plugin, linkerd-cni is run by the container runtime with CNI_COMMAND set.
Commands:
  version   print the build information
  install   install the plugin on this node and keep it installed (the DaemonSet's install-cni)
  repair    restart pods that started before the plugin was ready on their node
`

// Main runs the linkerd-cni subcommands of this package (the binary without CNI_COMMAND; main
// routes install and repair to their packages) and returns the exit code: 0 on success, 2 for a
// usage error.
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
