//go:build pluginonly

package main

import (
	"fmt"
	"os"
)

// The node's copy of the plugin leaves the DaemonSet processes out; say where they are.
var subcommands = map[string]func(args []string) int{
	"install": imageOnly("install"),
	"repair":  imageOnly("repair"),
	"agent":   imageOnly("agent"),
}

func imageOnly(name string) func([]string) int {
	return func([]string) int {
		fmt.Fprintf(os.Stderr, "linkerd-cni: %q is not in this plugin-only build (the copy on the node); run it from the linkerd-cni image\n", name)
		return 2
	}
}
