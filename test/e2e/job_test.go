//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kubemesh/proxy-init/test/helmchart"
)

// validatorRestart are the chart values of JobValidatorRestart.
var validatorRestart = map[string]any{"validatorRestart": map[string]any{"enabled": true}}

// validatorRestartPolicy returns the MutatingAdmissionPolicy and its binding as the chart renders
// them with validatorRestart.
func validatorRestartPolicy(t testing.TB) []runtime.Object {
	t.Helper()
	ch, err := helmchart.Load(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	all := maps.Clone(helmchart.ManifestValues)
	maps.Copy(all, validatorRestart)
	files, err := helmchart.Render(ch, all)
	if err != nil {
		t.Fatal(err)
	}
	const name = "50-validator-restart-policy.yaml"
	objs := decodeObjects(t, name, []byte(files[name]))
	if len(objs) != 2 {
		t.Fatalf("%s renders %d objects, want the policy and its binding", name, len(objs))
	}
	return objs
}

// meshedJob is deploy/examples' CNI workload as a Job on node n (restartPolicy: Never, no retry):
// its app dials out once and exits 0 only if the redirect took the connection to the proxy. The
// proxy sidecar has a startup probe, so the app starts once the proxy listens.
func meshedJob(t testing.TB, ns, name string, n *Node) *batchv1.Job {
	t.Helper()
	_, d := workload(t, "deploy/examples/cni-workload.yaml", ns, 1)
	tmpl := *d.Spec.Template.DeepCopy()
	tmpl.Spec.RestartPolicy = corev1.RestartPolicyNever
	pin(&tmpl.Spec, n)
	for i := range tmpl.Spec.InitContainers {
		if c := &tmpl.Spec.InitContainers[i]; c.Name == "linkerd-proxy" {
			c.StartupProbe = &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.Parse(inboundPort)}},
				PeriodSeconds: 1, FailureThreshold: 60}
		}
	}
	app := &tmpl.Spec.Containers[0]
	app.Command, app.Ports = []string{"/agent", "dial", outboundTarget[ipv4]}, nil
	zero := int32(0)
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: batchv1.JobSpec{BackoffLimit: &zero, Template: tmpl}}
}

// jobPod returns the one pod of a Job.
func jobPod(ctx context.Context, t testing.TB, c *Cluster, ns, job string) (*corev1.Pod, error) {
	l, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: batchv1.JobNameLabel + "=" + job})
	if err != nil {
		return nil, err
	}
	if len(l.Items) != 1 {
		return nil, fmt.Errorf("job %s has %d pods", job, len(l.Items))
	}
	return &l.Items[0], nil
}

// jobCondition waits until the Job has the condition typ (Complete or Failed).
func jobCondition(ctx context.Context, t testing.TB, c *Cluster, ns, job string, typ batchv1.JobConditionType, timeout time.Duration) {
	t.Helper()
	waitFor(ctx, t, timeout, "job "+job+" "+string(typ), func(ctx context.Context) (bool, error) {
		j, err := c.Client.BatchV1().Jobs(ns).Get(ctx, job, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		for _, cond := range j.Status.Conditions {
			if cond.Type == typ && cond.Status == corev1.ConditionTrue {
				return true, nil
			}
		}
		p, err := jobPod(ctx, t, c, ns, job)
		if err != nil {
			return false, err
		}
		return false, fmt.Errorf("conditions %v; pod %s", j.Status.Conditions, describePod(p))
	})
}

// testJobValidatorRestart: a Job's pod (restartPolicy: Never) that starts on node A before the
// plugin is there fails validation (exit 95). With the chart's validatorRestart policy its
// validator carries a restart rule for exit code 95: once the DaemonSet runs, the agent heals the
// pod in place, the kubelet reruns the validator, which passes, and the Job completes with that
// same pod. A Job whose validator has a restart policy of its own, which the policy leaves alone,
// fails for good, as every such Job did before.
func testJobValidatorRestart(t *testing.T, c *Cluster) {
	ctx := context.Background()
	removeDaemonSet(ctx, t, c)
	policy := validatorRestartPolicy(t)
	create(ctx, t, c.Client, policy...)
	t.Cleanup(func() {
		api := c.Client.AdmissionregistrationV1()
		_ = api.MutatingAdmissionPolicyBindings().Delete(ctx, policy[1].(*admissionv1.MutatingAdmissionPolicyBinding).Name, metav1.DeleteOptions{})
		_ = api.MutatingAdmissionPolicies().Delete(ctx, policy[0].(*admissionv1.MutatingAdmissionPolicy).Name, metav1.DeleteOptions{})
	})
	const ns = "e2e-job"
	t.Cleanup(func() { deleteNamespace(ctx, t, c.Client, ns) })
	healed, control := meshedJob(t, ns, "healed", c.A()), meshedJob(t, ns, "control", c.A())
	never := corev1.ContainerRestartPolicyNever
	control.Spec.Template.Spec.InitContainers[0].RestartPolicy = &never
	nsObj, _ := workload(t, "deploy/examples/cni-workload.yaml", ns, 1)
	create(ctx, t, c.Client, nsObj)
	// The policy takes effect once the API server has loaded it.
	waitFor(ctx, t, time.Minute, "the validatorRestart policy to be in force", func(ctx context.Context) (bool, error) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns}, Spec: healed.Spec.Template.Spec}
		got, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, err
		}
		return len(got.Spec.InitContainers[0].RestartPolicyRules) > 0, nil
	})
	create(ctx, t, c.Client, healed, control)

	failed := map[string]*corev1.Pod{}
	for _, job := range []string{"healed", "control"} {
		waitFor(ctx, t, 3*time.Minute, "the validator of job "+job+" to exit 95 without the plugin", func(ctx context.Context) (bool, error) {
			p, err := jobPod(ctx, t, c, ns, job)
			if err != nil {
				return false, err
			}
			failed[job] = p
			for _, cs := range p.Status.InitContainerStatuses {
				for _, term := range []*corev1.ContainerStateTerminated{cs.State.Terminated, cs.LastTerminationState.Terminated} {
					if cs.Name == "linkerd-network-validator" && term != nil && term.ExitCode == validatorFailed {
						return true, nil
					}
				}
			}
			return false, fmt.Errorf("%s", describePod(p))
		})
	}
	v := failed["healed"].Spec.InitContainers[0]
	if v.RestartPolicy == nil || *v.RestartPolicy != never || len(v.RestartPolicyRules) != 1 || fmt.Sprint(v.RestartPolicyRules[0].ExitCodes.Values) != "[95]" {
		t.Fatalf("the healed job's validator: restartPolicy %v, rules %+v; want Never and a restart on 95", v.RestartPolicy, v.RestartPolicyRules)
	}
	if rules := failed["control"].Spec.InitContainers[0].RestartPolicyRules; rules != nil {
		t.Fatalf("the control job's validator got rules %+v; the policy must leave a restart policy of its own alone", rules)
	}

	ds := installDaemonSetWith(ctx, t, c, validatorRestart)
	jobCondition(ctx, t, c, ns, "control", batchv1.JobFailed, 3*time.Minute)
	jobCondition(ctx, t, c, ns, "healed", batchv1.JobComplete, 6*time.Minute)
	p, err := jobPod(ctx, t, c, ns, "healed")
	if err != nil {
		t.Fatal(err)
	}
	if p.UID != failed["healed"].UID || p.Status.Phase != corev1.PodSucceeded {
		t.Errorf("the healed job's pod: %s (%s), %s; want the pod whose validator failed (%s), Succeeded",
			p.Name, p.UID, p.Status.Phase, failed["healed"].UID)
	}
	if st := p.Status.InitContainerStatuses[0]; st.RestartCount < 1 || exitCode(p, "linkerd-network-validator") != 0 {
		t.Errorf("the healed job's validator: %d restarts, %s; want a rerun that exited 0", st.RestartCount, describePod(p))
	}
	checkRepairedBy(ctx, t, c, ns, p.UID, ds[0], 1, "missing")
	t.Logf("the healed job's pod: %s; its app: %s", describePod(p), podLog(t, c, p, "web"))
}
