// Command proxy-init writes the netfilter rules that send a pod's TCP traffic through its sidecar
// proxy. It is Linkerd's proxy-init, command line included; all logic lives in package proxyinit.
package main

import (
	"context"
	"os"

	"github.com/kubemesh/proxy-init/proxyinit"
)

func main() {
	os.Exit(proxyinit.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
