//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kubemesh/proxy-init/internal/helmchart"
)

// The DaemonSet as deploy/linkerd-cni renders it.
const (
	cniNamespace  = "linkerd-cni"
	cniDaemonSet  = "linkerd-cni"
	cniSelector   = "k8s-app=linkerd-cni"
	conflistPath  = "/etc/cni/net.d/10-bridge.conflist"
	pluginPath    = "/opt/cni/bin/linkerd-cni"
	kubeconfigCNI = "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"
)

// installDaemonSet creates the objects of deploy/linkerd-cni, unchanged, and waits until the
// installer's pod is Ready: the plugin is then in the node's conflist.
func installDaemonSet(ctx context.Context, t testing.TB, n *Node) *corev1.Pod {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot(t), "deploy/linkerd-cni/*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in deploy/linkerd-cni (%v)", err)
	}
	for i, f := range files {
		files[i], _ = filepath.Rel(repoRoot(t), f)
	}
	objs := loadObjects(t, files...)
	ourDaemonSet(objs)
	create(ctx, t, n.Client, objs...)
	return &waitPods(ctx, t, n.Client, cniNamespace, cniSelector, 1, 3*time.Minute)[0]
}

// ourDaemonSet points the DaemonSet among objs at this build's images.
func ourDaemonSet(objs []runtime.Object) {
	for _, obj := range objs {
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			for i := range ds.Spec.Template.Spec.Containers {
				useOurImages(&ds.Spec.Template.Spec.Containers[i])
			}
		}
	}
}

// renderObjects renders the chart with values over the default rendering's (as deploy/ is
// made), pointed at this build's images.
func renderObjects(t testing.TB, values map[string]any) []runtime.Object {
	t.Helper()
	ch, err := helmchart.Load(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	all := maps.Clone(helmchart.ManifestValues)
	maps.Copy(all, values)
	files, err := helmchart.Render(ch, all)
	if err != nil {
		t.Fatal(err)
	}
	var objs []runtime.Object
	for _, name := range helmchart.Names(files) {
		if filepath.Dir(name) == "." {
			objs = append(objs, decodeObjects(t, name, []byte(files[name]))...)
		}
	}
	ourDaemonSet(objs)
	return objs
}

// removeDaemonSet deletes the DaemonSet and waits until its pod is gone, which is when the
// installer has taken the plugin out of the node's configuration.
func removeDaemonSet(ctx context.Context, t testing.TB, n *Node) {
	t.Helper()
	err := n.Client.AppsV1().DaemonSets(cniNamespace).Delete(ctx, cniDaemonSet, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete DaemonSet: %v", err)
	}
	waitGone(ctx, t, n.Client, cniNamespace, cniSelector, 2*time.Minute)
}

// conflistPlugins returns the types of the plugins in the node's bridge conflist.
func conflistPlugins(t testing.TB, n *Node) ([]string, map[string]any) {
	t.Helper()
	data, err := os.ReadFile(n.Path(conflistPath))
	if err != nil {
		t.Fatal(err)
	}
	var conf struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err := json.Unmarshal(data, &conf); err != nil {
		t.Fatalf("%s: %v\n%s", conflistPath, err, data)
	}
	var types []string
	var ours map[string]any
	for _, p := range conf.Plugins {
		types = append(types, p["type"].(string))
		if p["type"] == "linkerd-cni" {
			ours = p
		}
	}
	return types, ours
}

// testDaemonSet is scenario 1: the chart's default rendering runs from our image, copies the
// plugin and appends it to the conflist containerd reads, and its pod becomes Ready.
func testDaemonSet(t *testing.T, n *Node) {
	ctx := context.Background()
	removeDaemonSet(ctx, t, n)
	if types, _ := conflistPlugins(t, n); strings.Join(types, ",") != "bridge,portmap" {
		t.Fatalf("conflist before the DaemonSet: plugins %v, want bridge,portmap", types)
	}
	pod := installDaemonSet(ctx, t, n)
	t.Logf("installer pod %s Ready: %s", pod.Name, describePod(pod))
	for _, c := range pod.Spec.Containers {
		if want := ourImages["ghcr.io/kubemesh/linkerd-cni"]; c.Image != want {
			t.Errorf("container %s runs %s, want %s", c.Name, c.Image, want)
		}
	}

	types, ours := conflistPlugins(t, n)
	if strings.Join(types, ",") != "bridge,portmap,linkerd-cni" {
		t.Errorf("conflist plugins %v, want bridge,portmap,linkerd-cni", types)
	}
	if kube, _ := ours["kubernetes"].(map[string]any); kube["kubeconfig"] != kubeconfigCNI {
		t.Errorf("linkerd-cni kubernetes config %v, want kubeconfig %s", ours["kubernetes"], kubeconfigCNI)
	}
	if fi, err := os.Stat(n.Path(pluginPath)); err != nil || fi.Mode().Perm()&0o111 == 0 {
		t.Errorf("plugin %s on the node: %v, want an executable", pluginPath, err)
	}
	fi, err := os.Stat(n.Path(kubeconfigCNI))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("kubeconfig %s: %v, want mode 0600", kubeconfigCNI, err)
	}
	if data, err := os.ReadFile(n.Path(kubeconfigCNI)); err != nil || !strings.Contains(string(data), "https://"+serviceIP+":443") {
		t.Errorf("kubeconfig %s (%v) does not point at the kubernetes Service https://%s:443:\n%s", kubeconfigCNI, err, serviceIP, data)
	}
	waitFor(ctx, t, time.Minute, "the DaemonSet to count its pod ready", func(ctx context.Context) (bool, error) {
		ds, err := n.Client.AppsV1().DaemonSets(cniNamespace).Get(ctx, cniDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return ds.Status.NumberReady == 1, fmt.Errorf("status %+v", ds.Status)
	})
}
