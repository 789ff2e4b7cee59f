// Command kube-apiserver is the upstream Kubernetes API server, built from
// k8s.io/kubernetes at the version pinned in this module's go.mod, for the
// integration tests of the main module (see internal/kubetest).
//
// It adds nothing to upstream: it is the same main as
// k8s.io/kubernetes/cmd/kube-apiserver, compiled here because k8s.io/kubernetes
// cannot be built with "go install pkg@version" (its go.mod replaces its
// staging modules with local paths).
package main

import (
	"os"
	_ "time/tzdata" // CronJob time zones, as upstream does

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json, as upstream
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
