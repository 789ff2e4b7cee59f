package cniplugin

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	"github.com/kubemesh/proxy-init/test/runnertest"
)

// The plugin's failure policy, run through the real backend path with a fake applier: no root,
// no namespace, no kernel. The same policy runs against real backends in the integration tests.

type policyRig struct {
	fake      *iptablestest.Fake
	closeWait string
	plugin    *Plugin
	out, logs bytes.Buffer
	api       *fakeAPI
}

func newPolicyRig(t *testing.T, pod *Pod) *policyRig {
	r := &policyRig{fake: iptablestest.NewFake(), closeWait: filepath.Join(t.TempDir(), "close_wait"), api: &fakeAPI{pod: pod, ns: &Namespace{}}}
	if err := os.WriteFile(r.closeWait, []byte("60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.plugin = &Plugin{Stdout: &r.out, Stderr: &r.logs, Runner: runnertest.Runner(r.fake, r.closeWait),
		NewPodAPI: func(*NetConf) (PodAPI, error) { return r.api, nil }}
	return r
}

func (r *policyRig) args(t *testing.T) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c1", Netns: "/proc/self/ns/net", IfName: "eth0",
		Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0", StdinData: withVersion(t, linkerdChartConfig, "1.0.0")}
}

func cniCode(t *testing.T, err error) (uint, string) {
	t.Helper()
	var ce *types.Error
	if !errors.As(err, &ce) {
		t.Fatalf("err = %v, want a *types.Error", err)
	}
	return ce.Code, ce.Msg
}

func TestPolicyAddWritesAndCheckMatches(t *testing.T) {
	r := newPolicyRig(t, meshedPod(nil, map[string]string{AnnotationCloseWaitTimeout: "1h"}))
	if err := r.plugin.Add(r.args(t)); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	jsonEqual(t, r.out.String(), prevResults["1.0.0"])
	if d := r.fake.Dump(); !strings.Contains(d, "# ipv4\n-A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT\n") ||
		!strings.HasSuffix(d, "# ipv6\n") {
		t.Errorf("rules written:\n%s", d)
	}
	if b, _ := os.ReadFile(r.closeWait); string(b) != "3600" {
		t.Errorf("close-wait file %q, want 3600", b)
	}
	if err := r.plugin.Check(r.args(t)); err != nil {
		t.Errorf("CHECK after ADD: %v", err)
	}
	// A second ADD (the runtime retrying) writes nothing new.
	before := r.fake.Dump()
	r.out.Reset()
	if err := r.plugin.Add(r.args(t)); err != nil || r.fake.Dump() != before {
		t.Errorf("a repeated ADD: %v, rules now:\n%s", err, r.fake.Dump())
	}
}

func TestPolicyCheckNamesTheDifference(t *testing.T) {
	tests := []struct {
		name   string
		pod    *Pod
		tamper func(r *policyRig)
		want   []string
	}{
		{"a rule removed", meshedPod(nil, nil), func(r *policyRig) {
			st, _ := r.fake.Show(t.Context(), mustRules(t))
			r.fake.Set(iptables.IPv4, st.Families[0].Rules[:len(st.Families[0].Rules)-1])
		}, []string{"rules (fake) differ from the expected ones for a meshed pod", "ipv4: missing: -A PROXY_INIT_REDIRECT"}},
		{"rules on an unmeshed pod", &Pod{ObjectMeta: ObjectMeta{Name: "api-0", Namespace: "web"}, Spec: PodSpec{Containers: containers("app")}},
			func(r *policyRig) { r.fake.Set(iptables.IPv4, []string{"-A OUTPUT -j PROXY_INIT_OUTPUT"}) },
			[]string{"for a unmeshed pod", "ipv4: unmeshed pod has rules: extra: -A OUTPUT -j PROXY_INIT_OUTPUT"}},
		{"close-wait changed", meshedPod(nil, map[string]string{AnnotationCloseWaitTimeout: "120"}),
			func(r *policyRig) { _ = os.WriteFile(r.closeWait, []byte("60\n"), 0o644) },
			[]string{"close_wait is 60, want 120"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newPolicyRig(t, tt.pod)
			if err := r.plugin.Add(r.args(t)); err != nil {
				t.Fatal(err)
			}
			tt.tamper(r)
			code, msg := cniCode(t, r.plugin.Check(r.args(t)))
			if code != types.ErrInternal {
				t.Errorf("code %d, want %d", code, types.ErrInternal)
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("message lacks %q:\n%s", w, msg)
				}
			}
		})
	}
}

// mustRules is the chart config's rules, as the plugin builds them for a meshed pod.
func mustRules(t *testing.T) *iptables.Ruleset {
	t.Helper()
	conf, err := ParseConfig(withVersion(t, linkerdChartConfig, "1.0.0"))
	if err != nil {
		t.Fatal(err)
	}
	rs, err := iptables.Build(conf.Linkerd.Config)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func TestPolicyAddFailureIsInternalAndPrintsNoResult(t *testing.T) {
	r := newPolicyRig(t, meshedPod(nil, nil))
	r.fake.Fail("apply", errors.New("kernel says no"))
	code, msg := cniCode(t, r.plugin.Add(r.args(t)))
	if code != types.ErrInternal || !strings.Contains(msg, "pod web/api-0, netns /proc/self/ns/net: apply rules with fake: kernel says no") {
		t.Errorf("code %d, message %q", code, msg)
	}
	if r.out.Len() != 0 {
		t.Errorf("a failed ADD printed a result: %s", r.out.String())
	}
	if !strings.Contains(r.logs.String(), "kernel says no") {
		t.Errorf("the failure is not logged:\n%s", r.logs.String())
	}
}

func TestPolicyDelWarnsButSucceeds(t *testing.T) {
	r := newPolicyRig(t, meshedPod(nil, nil))
	if err := r.plugin.Add(r.args(t)); err != nil {
		t.Fatal(err)
	}
	r.out.Reset() // ADD's result
	r.fake.Fail("cleanup", errors.New("table busy"))
	if err := r.plugin.Del(r.args(t)); err != nil {
		t.Errorf("DEL failed: %v", err)
	}
	if !strings.Contains(r.logs.String(), "could not remove rules; they go with the netns") || !strings.Contains(r.logs.String(), "table busy") {
		t.Errorf("DEL did not warn:\n%s", r.logs.String())
	}
	r.fake.Fail("cleanup", nil)
	if err := r.plugin.Del(r.args(t)); err != nil || r.fake.Dump() != "# ipv4\n# ipv6\n" {
		t.Errorf("DEL: %v, left:\n%s", err, r.fake.Dump())
	}
	if r.out.Len() != 0 {
		t.Errorf("DEL printed %q", r.out.String())
	}
}
