//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// linkerdLayouts are testdata/linkerd's pod specs, written by Linkerd's injector (see its
// README), in the order the scenario runs them; cni tells whether the layout needs the plugin.
var linkerdLayouts = []struct {
	name, file string
	cni        bool
}{
	{"2.19", "linkerd-2.19.yaml", false},
	{"2.20", "linkerd-2.20-default.yaml", false},
	{"2.20-cni", "linkerd-2.20-cni.yaml", true},
}

// linkerdImage maps the images of Linkerd's pod specs to this build's: Linkerd's proxy image to
// the stand-in, its proxy-init image to ours. Nothing else of the spec changes.
func linkerdImage(t testing.TB, ctr *corev1.Container) {
	t.Helper()
	repo := ctr.Image[:strings.LastIndex(ctr.Image, ":")]
	switch repo {
	case "cr.l5d.io/linkerd/proxy":
		ctr.Image = ProxyStandIn
	case "cr.l5d.io/linkerd/proxy-init":
		ctr.Image = ourImages["ghcr.io/kubemesh/proxy-init"]
	case "e2e.test/agent":
	default:
		t.Fatalf("container %s runs %s, which the scenario has no stand-in for", ctr.Name, ctr.Image)
	}
}

// testLinkerdInjected: pods as Linkerd 2.19 and 2.20 inject them (three layouts, testdata/linkerd),
// with only image names changed, start on node A: every init container exits 0, every
// container runs, and the app's outbound and inbound (from node B) TCP reach the proxy with
// their original destinations. The layouts with linkerd-init run without the DaemonSet, so the
// rules can only be proxy-init's; the cniEnabled one runs under the plugin.
func testLinkerdInjected(t *testing.T, c *Cluster) {
	ctx := context.Background()
	peer := peerPod(ctx, t, c.B())
	for _, l := range linkerdLayouts {
		t.Run(l.name, func(t *testing.T) {
			if l.cni {
				installDaemonSet(ctx, t, c)
			} else {
				removeDaemonSet(ctx, t, c)
			}
			ns := "e2e-linkerd-" + strings.ReplaceAll(l.name, ".", "")
			t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
			objs := loadObjects(t, "test/e2e/testdata/linkerd/"+l.file)
			if len(objs) != 1 {
				t.Fatalf("%s: want one Deployment, got %d objects", l.file, len(objs))
			}
			deploy, ok := objs[0].(*appsv1.Deployment)
			if !ok {
				t.Fatalf("%s: %T is not a Deployment", l.file, objs[0])
			}
			deploy.Namespace = ns
			spec := &deploy.Spec.Template.Spec
			pin(spec, c.A())
			for i := range spec.InitContainers {
				linkerdImage(t, &spec.InitContainers[i])
			}
			for i := range spec.Containers {
				linkerdImage(t, &spec.Containers[i])
			}
			create(ctx, t, c.Client, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, deploy)
			pod := &waitPods(ctx, t, c.Client, ns, "app=web", 1, 3*time.Minute)[0]
			for _, cs := range pod.Status.InitContainerStatuses {
				if cs.State.Terminated != nil && cs.State.Terminated.ExitCode != 0 || cs.RestartCount != 0 {
					t.Errorf("init container %s: %s, %d restarts; want exit 0 the first time", cs.Name, describePod(pod), cs.RestartCount)
				}
			}
			for _, cs := range pod.Status.ContainerStatuses {
				if cs.State.Running == nil || !cs.Ready {
					t.Errorf("container %s not running and ready: %s", cs.Name, describePod(pod))
				}
			}
			t.Logf("%s: %s", l.file, describePod(pod))
			if rules := ourRules(ctx, t, podNetNS(ctx, t, c, pod, "web")); len(rules) == 0 {
				t.Error("no proxy-init rules in the pod's network namespace")
			}
			checkMeshedTraffic(ctx, t, c, pod, peer, ipv4)
		})
	}
}
