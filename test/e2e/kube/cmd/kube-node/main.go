// Command kube-node is kube-controller-manager, kube-scheduler and kubelet in one binary, built
// from k8s.io/kubernetes at the version this module's go.mod pins, for the end-to-end node of
// test/e2e. The first argument names the component; the rest is that component's own command
// line, exactly as upstream parses it:
//
//	kube-node kubelet --config kubelet.yaml ...
//	kube-node kube-controller-manager --kubeconfig ...
//	kube-node kube-scheduler --kubeconfig ...
//
// One binary instead of three because the three share most of their code: one link, one file in
// the cache, a third of the disk. It adds nothing to upstream; each entry is the same call as
// upstream's main (k8s.io/kubernetes cannot be built with "go install pkg@version", since its
// go.mod replaces its staging modules with local paths).
package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	_ "time/tzdata" // CronJob time zones, as upstream kube-controller-manager does

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
	kubelet "k8s.io/kubernetes/cmd/kubelet/app"
)

var components = map[string]func() *cobra.Command{
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
	"kubelet":                 func() *cobra.Command { return kubelet.NewKubeletCommand(context.Background()) },
}

func main() {
	if len(os.Args) < 2 || components[os.Args[1]] == nil {
		names := make([]string, 0, len(components))
		for n := range components {
			names = append(names, n)
		}
		slices.Sort(names)
		fmt.Fprintf(os.Stderr, "usage: kube-node %s [flags]\n", strings.Join(names, "|"))
		os.Exit(2)
	}
	cmd := components[os.Args[1]]()
	cmd.SetArgs(os.Args[2:])
	os.Exit(cli.Run(cmd))
}
