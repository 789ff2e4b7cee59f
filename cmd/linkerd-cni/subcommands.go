//go:build !pluginonly

package main

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/cniplugin/install"
	"github.com/kubemesh/proxy-init/cniplugin/repair"
)

// subcommands are the long-running DaemonSet processes, left out of the pluginonly build.
var subcommands = map[string]func(args []string) int{
	"install": install.Main,
	"repair":  untilSignal(repair.Main),
	"agent":   untilSignal(agent.Main),
}

func subcommand(name string) func(args []string) int { return subcommands[name] }

func untilSignal(run func(context.Context, []string, io.Writer, io.Writer) int) func([]string) int {
	return func(args []string) int {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return run(ctx, args, os.Stdout, os.Stderr)
	}
}
