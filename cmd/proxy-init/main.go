// Command proxy-init writes the netfilter rules that send a pod's TCP traffic through its sidecar
// proxy. It is Linkerd's proxy-init, command line included; all logic lives in package proxyinit.
// Under one of Linkerd's names (linkerd2-proxy-init, linkerd2-network-validator; see package
// multicall) it runs what that name runs in Linkerd. The settings that hold for the whole process
// are made here, not in the library, whose tests run in one process.
//
// # Tests
//
// As root: the nft and auto modes execute no program (TestNFTModeExecsNothing, under strace);
// without CAP_NET_ADMIN (or NET_RAW) every mode names it and the namespace (TestMissingCapability,
// setpriv); apply, show and cleanup through the binary, Linkerd's chart lines in the default and
// nft modes, --simulate writes nothing and prints the batch for the namespace's state, bad input
// writes nothing, the close-wait sysctl, Linkerd's binary names; SIGTERM and SIGINT while apply and
// cleanup wait to write change nothing (TestSignalsIgnoredWhileWriting).
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
		// A one-shot run allocates a few megabytes at most; collecting garbage would only add
		// to the pod's start-up. The limit keeps a pathological input from growing without
		// bound.
		debug.SetGCPercent(-1)
		debug.SetMemoryLimit(256 << 20)
		// SIGINT and SIGTERM are harmless for the rest of the run: a write takes milliseconds
		// and proxy-init exits right after it, and stopping between the IPv4 and IPv6
		// transactions, or before a rollback, would leave half a mesh. The restore binaries
		// inherit the disposition, so they finish too.
		signal.Ignore(os.Interrupt, syscall.SIGTERM)
	}
	os.Exit(proxyinit.Main(context.Background(), args, os.Stdout, os.Stderr))
}
