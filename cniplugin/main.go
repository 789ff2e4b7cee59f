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
  install   run the DaemonSet installer (not implemented yet)
  repair    run the repair controller (not implemented yet)
`

// Main runs a linkerd-cni subcommand (the binary without CNI_COMMAND) and returns the exit code:
// 0 on success, 2 for a usage error or a command that does not exist yet.
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
	case "install", "repair":
		fmt.Fprintf(stderr, "linkerd-cni %s: not implemented yet\n", args[0])
		return 2
	}
	fmt.Fprintf(stderr, "linkerd-cni: unknown command %q\n\n%s", args[0], usage)
	return 2
}
