// Command linkerd-cni-api is the companion of the node's linkerd-cni plugin: the same plugin with
// the Kubernetes API client (package cniplugin/kubeapi). The plugin links no client, so that its
// start-up on every pod's sandbox set-up stays that of a small Go program, and runs this binary,
// which the installer copies beside it, with its own standard input and environment for the calls
// that must read the API: those the node agent does not take, and STATUS. It does not ask the
// agent again.
package main

import (
	"os"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/kubeapi"
)

func main() {
	if os.Getenv("CNI_COMMAND") != "" {
		p := cniplugin.New()
		p.NewPodAPI, p.AskAgent = kubeapi.NewKubeClient, false
		cniplugin.PluginMain(p)
	}
	os.Exit(cniplugin.CompanionMain(os.Args[1:], os.Stdout, os.Stderr))
}
