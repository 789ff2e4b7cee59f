//go:build pluginonly

package main

import (
	"fmt"
	"os"
)

// The node's copy of the plugin leaves the DaemonSet processes out; say where they are. A
// function, not a map: the plugin runs no package initialiser of ours.
func subcommand(name string) func(args []string) int {
	if name != "install" && name != "repair" && name != "agent" {
		return nil
	}
	return func([]string) int {
		fmt.Fprintf(os.Stderr, "linkerd-cni: %q is not in this plugin-only build (the copy on the node); run it from the linkerd-cni image\n", name)
		return 2
	}
}
