// Command proxy-init writes the netfilter rules that send a pod's TCP traffic through its sidecar
// proxy. It is Linkerd's proxy-init, command line included; all logic lives in package proxyinit.
// Under one of Linkerd's names (linkerd2-proxy-init, linkerd2-network-validator; see package
// multicall) it runs what that name runs in Linkerd.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/kubemesh/proxy-init/internal/multicall"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/proxyinit"
)

func main() {
	if err := netnsutil.EntryHookError(); err != nil {
		fmt.Fprintln(os.Stderr, "proxy-init: refusing to start: "+err.Error())
		os.Exit(proxyinit.ExitFailure)
	}
	args, err := multicall.Args(multicall.ProxyInit, os.Args)
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy-init: "+err.Error())
		os.Exit(proxyinit.ExitUsage)
	}
	os.Exit(proxyinit.Main(context.Background(), args, os.Stdout, os.Stderr))
}
