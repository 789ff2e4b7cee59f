package install

// The chart's validatorRestart policy against a real kube-apiserver (test/kubetest, the
// MutatingAdmissionPolicy admission plugin on, as in every v1.37 server): pods are created for
// real and read back, so what is checked is what the kubelet would get.

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/test/kubetest"
)

// TestValidatorRestartPolicy: with validatorRestart.enabled, the validator of a restartPolicy:
// Never pod gets a restart rule for exit code 95 (and the container restartPolicy the API wants
// beside it); every other pod, and every other container, is created exactly as it was sent.
func TestValidatorRestartPolicy(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: starts kube-apiserver and etcd")
	}
	ms := renderChart(t, loadChart(t), map[string]any{"validatorRestart": map[string]any{"enabled": true}})
	for _, m := range renderChart(t, loadChart(t), nil) {
		if strings.HasPrefix(m.obj.GetKind(), "MutatingAdmissionPolicy") {
			t.Errorf("the default rendering holds %s", m)
		}
	}
	cluster := kubetest.Start(t, kubetest.Options{})
	c := newAPIClient(t, cluster.AdminConfig())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	policies := 0
	for _, m := range ms {
		if strings.HasPrefix(m.obj.GetKind(), "MutatingAdmissionPolicy") {
			if _, err := c.apply(ctx, m.obj, false); err != nil {
				t.Fatalf("apply %s: %v", m, err)
			}
			policies++
		}
	}
	if policies != 2 {
		t.Fatalf("the rendering holds %d MutatingAdmissionPolicy objects, want the policy and its binding", policies)
	}

	never, onFailure := corev1.ContainerRestartPolicyNever, corev1.ContainerRestartPolicyOnFailure
	always := corev1.ContainerRestartPolicyAlways
	rule95 := []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart,
		ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{95}}}}
	ownRule := []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestart,
		ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpNotIn, Values: []int32{0}}}}
	// The pod Linkerd's injector makes with the CNI: the validator, then the native sidecar
	// proxy; here behind another init container, so the validator is not the first.
	initContainers := func(validator *corev1.Container) []corev1.Container {
		ics := []corev1.Container{{Name: "setup", Image: "registry.invalid/setup:1"}}
		if validator != nil {
			ics = append(ics, *validator)
		}
		return append(ics, corev1.Container{Name: "linkerd-proxy", Image: "registry.invalid/proxy:1", RestartPolicy: &always})
	}
	validator := func(policy *corev1.ContainerRestartPolicy, rules []corev1.ContainerRestartRule) *corev1.Container {
		return &corev1.Container{Name: agent.ValidatorContainer, Image: "registry.invalid/proxy:1", RestartPolicy: policy, RestartPolicyRules: rules}
	}
	tests := []struct {
		name   string
		policy corev1.RestartPolicy
		sent   []corev1.Container
		want   []corev1.Container // nil: as sent
	}{
		{"a Job's pod: Never, with the validator", corev1.RestartPolicyNever,
			initContainers(validator(nil, nil)), initContainers(validator(&never, rule95))},
		{"OnFailure reruns a failed validator already", corev1.RestartPolicyOnFailure, initContainers(validator(nil, nil)), nil},
		{"Always reruns a failed validator already", corev1.RestartPolicyAlways, initContainers(validator(nil, nil)), nil},
		{"Never, without the validator", corev1.RestartPolicyNever, initContainers(nil), nil},
		{"Never, the validator with rules of its own", corev1.RestartPolicyNever, initContainers(validator(&never, ownRule)), nil},
		{"Never, the validator with a restart policy of its own", corev1.RestartPolicyNever, initContainers(validator(&onFailure, nil)), nil},
	}
	ns := "validator-restart"
	if _, err := c.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod := func(name string, policy corev1.RestartPolicy, ics []corev1.Container) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.PodSpec{
			RestartPolicy: policy, InitContainers: ics, Containers: []corev1.Container{{Name: "app", Image: "registry.invalid/app:1"}}}}
	}
	// A policy takes effect once the API server has loaded it: wait for a mutated dry run.
	waitFor(t, 30*time.Second, "the policy to be in force", func() (bool, string) {
		got, err := c.cs.CoreV1().Pods(ns).Create(ctx, pod("probe", corev1.RestartPolicyNever, tests[0].sent),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err.Error()
		}
		return got.Spec.InitContainers[1].RestartPolicyRules != nil, fmt.Sprint(got.Spec.InitContainers)
	})
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := c.cs.CoreV1().Pods(ns).Create(ctx, pod(fmt.Sprintf("pod-%d", i), tt.policy, tt.sent), metav1.CreateOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want := tt.want
			if want == nil {
				want = tt.sent
			}
			if len(got.Spec.InitContainers) != len(want) {
				t.Fatalf("init containers %v, want %v", got.Spec.InitContainers, want)
			}
			for j, w := range want {
				g := got.Spec.InitContainers[j]
				if g.Name != w.Name || !reflect.DeepEqual(g.RestartPolicy, w.RestartPolicy) || !reflect.DeepEqual(g.RestartPolicyRules, w.RestartPolicyRules) {
					t.Errorf("init container %d: %s, restartPolicy %v, rules %v; want %s, %v, %v", j,
						g.Name, deref(g.RestartPolicy), g.RestartPolicyRules, w.Name, deref(w.RestartPolicy), w.RestartPolicyRules)
				}
			}
			if got.Spec.RestartPolicy != tt.policy || got.Spec.Containers[0].RestartPolicy != nil {
				t.Errorf("pod restartPolicy %s, app container's %v: changed", got.Spec.RestartPolicy, deref(got.Spec.Containers[0].RestartPolicy))
			}
		})
	}
}

func deref[T any](p *T) any {
	if p == nil {
		return nil
	}
	return *p
}
