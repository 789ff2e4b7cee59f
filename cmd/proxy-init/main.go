// Command proxy-init writes the netfilter rules that send a pod's TCP traffic through its sidecar
// proxy. It is Linkerd's proxy-init, command line included; all logic lives in package proxyinit.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/kubemesh/proxy-init/proxyinit"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := proxyinit.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
