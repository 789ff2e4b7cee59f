package release

import (
	"context"
	"path/filepath"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/cli"
	"helm.sh/helm/v3/pkg/registry"
	helmrelease "helm.sh/helm/v3/pkg/release"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"

	"github.com/kubemesh/proxy-init/test/helmchart"
	"github.com/kubemesh/proxy-init/test/kubetest"
	"github.com/kubemesh/proxy-init/tools/chart"
)

// TestChartInstallsFromOCI is `helm install linkerd2-cni oci://…/linkerd2-cni --version V` with
// Helm's library: the chart pushed to a registry in the test process, installed into a real
// kube-apiserver, its DaemonSet running the release's image.
func TestChartInstallsFromOCI(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: starts kube-apiserver and etcd")
	}
	host := startRegistry(t, true)
	pkg, err := chart.Package(repoRoot, t.TempDir(), testVersion, host+"/kubemesh/linkerd-cni")
	if err != nil {
		t.Fatal(err)
	}
	ref, _, err := chart.Push(pkg, host+"/kubemesh", epoch)
	if err != nil {
		t.Fatal(err)
	}
	if want := host + "/kubemesh/linkerd2-cni:0.3.0-rc.1"; ref != want {
		t.Errorf("pushed %s, want %s", ref, want)
	}
	cluster := kubetest.Start(t, kubetest.Options{})
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := cluster.WriteAdminKubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	ns := helmchart.Namespace
	flags := genericclioptions.NewConfigFlags(false)
	flags.KubeConfig, flags.Namespace = &kubeconfig, &ns
	cfg := new(action.Configuration)
	if err := cfg.Init(flags, ns, "secret", t.Logf); err != nil {
		t.Fatal(err)
	}
	rc, err := registry.NewClient(registry.ClientOptPlainHTTP())
	if err != nil {
		t.Fatal(err)
	}
	settings := cli.New()
	settings.RepositoryCache, settings.RepositoryConfig = t.TempDir(), filepath.Join(t.TempDir(), "repositories.yaml")
	install := action.NewInstall(cfg)
	install.ReleaseName, install.Namespace, install.CreateNamespace = helmchart.ReleaseName, ns, true
	install.Version = "0.3.0-rc.1"
	install.SetRegistryClient(rc)
	path, err := install.LocateChart("oci://"+host+"/kubemesh/linkerd2-cni", settings)
	if err != nil {
		t.Fatal(err)
	}
	ch, err := loader.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rel, err := install.Run(ch, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rel.Info.Status != helmrelease.StatusDeployed || rel.Chart.Metadata.Version != "0.3.0-rc.1" || rel.Chart.Metadata.AppVersion != testVersion {
		t.Errorf("release %s of chart %s (app %s), want deployed 0.3.0-rc.1 (%s)", rel.Info.Status, rel.Chart.Metadata.Version, rel.Chart.Metadata.AppVersion, testVersion)
	}
	ds, err := cluster.Clientset.AppsV1().DaemonSets(ns).Get(context.Background(), "linkerd-cni", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := host + "/kubemesh/linkerd-cni:" + testVersion
	for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
		if c.Image != want {
			t.Errorf("container %s runs %s, want %s", c.Name, c.Image, want)
		}
	}
}
