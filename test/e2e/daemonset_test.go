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

	"github.com/kubemesh/proxy-init/test/helmchart"
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

// installed is the chart values the running DaemonSet was rendered with ("" for
// deploy/linkerd-cni), or "none".
var installed = "none"

// installDaemonSet creates the objects of deploy/linkerd-cni, unchanged but for our images, and
// waits until the installer's pod on every node is Ready: the plugin is then in every node's
// conflist. The pods are returned in the order of c.Nodes.
func installDaemonSet(ctx context.Context, t testing.TB, c *Cluster) []*corev1.Pod {
	t.Helper()
	return installDaemonSetWith(ctx, t, c, nil)
}

// installDaemonSetWith is installDaemonSet with the linkerd2-cni chart rendered with values
// (over make manifests' own, createNamespace: true) instead of deploy/linkerd-cni. A DaemonSet
// running with other values is removed first.
func installDaemonSetWith(ctx context.Context, t testing.TB, c *Cluster, values map[string]any) []*corev1.Pod {
	t.Helper()
	key := ""
	var objs []runtime.Object
	if values == nil {
		files, err := filepath.Glob(filepath.Join(repoRoot(t), "deploy/linkerd-cni/*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no manifests in deploy/linkerd-cni (%v)", err)
		}
		for i, f := range files {
			files[i], _ = filepath.Rel(repoRoot(t), f)
		}
		objs = loadObjects(t, files...)
	} else {
		all := maps.Clone(helmchart.ManifestValues)
		maps.Copy(all, values)
		raw, _ := json.Marshal(all)
		key = string(raw)
		ch, err := helmchart.Load(repoRoot(t))
		if err != nil {
			t.Fatal(err)
		}
		files, err := helmchart.Render(ch, all)
		if err != nil {
			t.Fatalf("render the chart with %s: %v", key, err)
		}
		for _, name := range helmchart.Names(files) {
			if filepath.Dir(name) == "." { // not optional/ nor the chart's tests/
				objs = append(objs, decodeObjects(t, name, []byte(files[name]))...)
			}
		}
	}
	if installed != key && installed != "none" {
		removeDaemonSet(ctx, t, c)
	}
	for _, obj := range objs {
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			for i := range ds.Spec.Template.Spec.Containers {
				useOurImages(&ds.Spec.Template.Spec.Containers[i])
			}
		}
		if cm, ok := obj.(*corev1.ConfigMap); ok {
			// The ConfigMap may be left from other values: the installer reads it at start.
			_, err := c.Client.CoreV1().ConfigMaps(cm.Namespace).Update(ctx, cm, metav1.UpdateOptions{})
			if err != nil && !apierrors.IsNotFound(err) {
				t.Fatalf("update ConfigMap %s: %v", cm.Name, err)
			}
		}
	}
	create(ctx, t, c.Client, objs...)
	installed = key
	return daemonSetPods(ctx, t, c)
}

// daemonSetPods waits until the DaemonSet runs a Ready pod on every node and returns them in the
// order of c.Nodes.
func daemonSetPods(ctx context.Context, t testing.TB, c *Cluster) []*corev1.Pod {
	t.Helper()
	pods := waitPods(ctx, t, c.Client, cniNamespace, cniSelector, len(c.Nodes), 3*time.Minute)
	byNode := make([]*corev1.Pod, len(c.Nodes))
	for i := range pods {
		for j, n := range c.Nodes {
			if pods[i].Spec.NodeName == n.Name {
				byNode[j] = &pods[i]
			}
		}
	}
	for j, p := range byNode {
		if p == nil {
			t.Fatalf("no DaemonSet pod on node %s", c.Nodes[j].Name)
		}
	}
	return byNode
}

// removeDaemonSet deletes the DaemonSet and waits until its pods are gone, which is when the
// installers have taken the plugin out of the nodes' configuration.
func removeDaemonSet(ctx context.Context, t testing.TB, c *Cluster) {
	t.Helper()
	err := c.Client.AppsV1().DaemonSets(cniNamespace).Delete(ctx, cniDaemonSet, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatalf("delete DaemonSet: %v", err)
	}
	waitGone(ctx, t, c.Client, cniNamespace, cniSelector, 2*time.Minute)
	installed = "none"
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

// testDaemonSet: the chart's default rendering runs from our image on every node, copies the
// plugin and appends it to the conflist containerd reads, and its pods become Ready.
func testDaemonSet(t *testing.T, c *Cluster) {
	ctx := context.Background()
	removeDaemonSet(ctx, t, c)
	for _, n := range c.Nodes {
		if types, _ := conflistPlugins(t, n); strings.Join(types, ",") != "bridge,portmap" {
			t.Fatalf("node %s: conflist before the DaemonSet: plugins %v, want bridge,portmap", n.Name, types)
		}
	}
	pods := installDaemonSet(ctx, t, c)
	for i, n := range c.Nodes {
		pod := pods[i]
		t.Logf("installer pod %s on %s Ready: %s", pod.Name, n.Name, describePod(pod))
		for _, ctr := range pod.Spec.Containers {
			if want := ourImages["ghcr.io/kubemesh/linkerd-cni"]; ctr.Image != want {
				t.Errorf("container %s runs %s, want %s", ctr.Name, ctr.Image, want)
			}
		}
		types, ours := conflistPlugins(t, n)
		if strings.Join(types, ",") != "bridge,portmap,linkerd-cni" {
			t.Errorf("node %s: conflist plugins %v, want bridge,portmap,linkerd-cni", n.Name, types)
		}
		if kube, _ := ours["kubernetes"].(map[string]any); kube["kubeconfig"] != kubeconfigCNI {
			t.Errorf("node %s: linkerd-cni kubernetes config %v, want kubeconfig %s", n.Name, ours["kubernetes"], kubeconfigCNI)
		}
		if fi, err := os.Stat(n.Path(pluginPath)); err != nil || fi.Mode().Perm()&0o111 == 0 {
			t.Errorf("node %s: %s: %v, want an executable", n.Name, pluginPath, err)
		}
		fi, err := os.Stat(n.Path(kubeconfigCNI))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("node %s: kubeconfig %s: %v, want mode 0600", n.Name, kubeconfigCNI, err)
		}
		if data, err := os.ReadFile(n.Path(kubeconfigCNI)); err != nil || !strings.Contains(string(data), "https://"+serviceIP+":443") {
			t.Errorf("node %s: kubeconfig %s (%v) does not point at the kubernetes Service https://%s:443:\n%s", n.Name, kubeconfigCNI, err, serviceIP, data)
		}
	}
	waitFor(ctx, t, time.Minute, "the DaemonSet to count its pods ready", func(ctx context.Context) (bool, error) {
		ds, err := c.Client.AppsV1().DaemonSets(cniNamespace).Get(ctx, cniDaemonSet, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return ds.Status.NumberReady == int32(len(c.Nodes)), fmt.Errorf("status %+v", ds.Status)
	})
}
