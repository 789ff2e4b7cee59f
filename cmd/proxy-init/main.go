// Command proxy-init writes the netfilter rules that send a pod's TCP traffic through its sidecar
// proxy: Linkerd's proxy-init, command line and binary names included (package multicall). All
// logic lives in package proxyinit; the process-wide settings are made here.
//
// # Tests
//
// As root, through the binary: every command, Linkerd's command lines and names, no exec in nft
// and auto, the missing-capability errors, and signals that change nothing mid-write.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/kubemesh/proxy-init/internal/multicall"
	"github.com/kubemesh/proxy-init/proxyinit"
)

func main() {
	args, err := multicall.Args(multicall.ProxyInit, os.Args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy-init: "+err.Error())
		os.Exit(proxyinit.ExitUsage)
	}
	if proxyinit.OneShot(args) {
		// A one-shot run allocates a few megabytes: GC would only slow the pod's start.
		debug.SetGCPercent(-1)
		debug.SetMemoryLimit(256 << 20)
		// A write takes milliseconds, and stopping between the IPv4 and IPv6 transactions, or
		// before a rollback, would leave half a mesh; the restore binaries inherit this too.
		signal.Ignore(os.Interrupt, syscall.SIGTERM)
	}
	os.Exit(proxyinit.Main(context.Background(), args, os.Stdout, os.Stderr))
}
