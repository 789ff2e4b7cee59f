package agent

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/cniplugin"
)

// TestPluginPodIsRecode: the agent's direct conversion of a watched pod gives the plugin what
// decoding the pod's JSON into the plugin's types gives (recode, the plugin's own API path), for
// every field the plugin reads, with and without each of them set.
func TestPluginPodIsRecode(t *testing.T) {
	always := corev1.ContainerRestartPolicyAlways
	pods := map[string]*corev1.Pod{
		"empty": {},
		"full": {
			ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "app", UID: "u-1",
				Labels:      map[string]string{"app": "web"},
				Annotations: map[string]string{"linkerd.io/inject": "enabled", "config.linkerd.io/skip-outbound-ports": "3306"}},
			Spec: corev1.PodSpec{
				InitContainers: []corev1.Container{{Name: "linkerd-init"}, {Name: "linkerd-proxy", RestartPolicy: &always}},
				Containers:     []corev1.Container{{Name: "app", Image: "app:1"}},
				HostNetwork:    true,
			},
		},
		"empty maps and slices": {
			ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{}, Annotations: map[string]string{}},
			Spec:       corev1.PodSpec{InitContainers: []corev1.Container{}, Containers: []corev1.Container{}},
		},
	}
	for name, pod := range pods {
		want, err := recode[cniplugin.Pod](pod)
		if err != nil {
			t.Fatal(err)
		}
		got := pluginPod(pod)
		// An empty list and none read the same (Classify ranges over them).
		for _, p := range []*cniplugin.Pod{want, got} {
			for _, l := range []*[]cniplugin.Container{&p.Spec.InitContainers, &p.Spec.Containers} {
				if len(*l) == 0 {
					*l = nil
				}
			}
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: pluginPod gives %+v, the pod's JSON %+v", name, got, want)
		}
		ns := &corev1.Namespace{ObjectMeta: pod.ObjectMeta}
		wantNS, err := recode[cniplugin.Namespace](ns)
		if err != nil {
			t.Fatal(err)
		}
		if gotNS := (cniplugin.Namespace{ObjectMeta: pluginMeta(ns.ObjectMeta)}); !reflect.DeepEqual(&gotNS, wantNS) {
			t.Errorf("%s: the namespace gives %+v, its JSON %+v", name, gotNS, wantNS)
		}
	}
	// The watch's objects are shared: what the plugin's code is given is its own.
	full := pods["full"]
	pluginPod(full).Annotations["linkerd.io/inject"] = "disabled"
	if full.Annotations["linkerd.io/inject"] != "enabled" {
		t.Error("editing the converted pod's annotations edited the watched pod")
	}
}
