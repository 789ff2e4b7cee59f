//go:build pluginonly

package main

import (
	"fmt"
	"os"

	"github.com/kubemesh/proxy-init/cniplugin"
)

// newPlugin is the node's plugin: without an API client, it runs the companion binary for the
// calls that need one.
func newPlugin() *cniplugin.Plugin { return cniplugin.New() }

// The node's copy of the plugin leaves the DaemonSet processes out; say where they are rather
// than calling them unknown.
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
