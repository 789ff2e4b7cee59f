package agent_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/kubetest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// drift is a way a pod's rules go wrong, and how CHECK names it.
type drift struct {
	name string
	make func(t *testing.T, p *pod, rs rules)
	want string
}

var drifts = []drift{
	{"missing rules", func(*testing.T, *pod, rules) {}, "missing"},
	{"different rules", func(t *testing.T, p *pod, _ rules) {
		apply(t, p, expected(t, iptables.ModeNFT, func(c *iptables.Config) { c.OutboundProxyPort = 4141 }))
	}, "4141"},
	{"rules of another backend", func(t *testing.T, p *pod, rs rules) {
		apply(t, p, rs)
		apply(t, p, expected(t, iptables.ModeNFTables, nil)) // the native table, which removes iptables-nft's
	}, "missing"},
	{"half-applied", func(t *testing.T, p *pod, rs rules) {
		if _, err := nt.RunInWithInput(t, p.netns, iptables.TransitionPayload(iptables.SavedState{}, rs.rs.Saved(iptables.IPv4)), "iptables-nft-restore", "--noflush"); err != nil {
			t.Fatal(err)
		}
	}, "ipv4 has every rule but ipv6 has none"},
	{"a rule deleted by hand", func(t *testing.T, p *pod, rs rules) {
		apply(t, p, rs)
		if _, err := nt.RunIn(t, p.netns, "iptables-nft", "-t", "nat", "-D", "PROXY_INIT_OUTPUT", "1"); err != nil {
			t.Fatal(err)
		}
	}, "2102"},
}

// testAudit: each drift is found by one audit pass with CHECK's description, and handled by the
// mode: repair rewrites the rules (one Event each time it does), report only records (one Event,
// however many passes), delete deletes a pod that has an owner and only reports one that has not.
// Matching pods cost no Event and no write.
func testAudit(t *testing.T, c *kubetest.Cluster) {
	rs := expected(t, iptables.ModeNFT, nil)
	for _, mode := range agent.Modes {
		t.Run(string(mode), func(t *testing.T) {
			r := newRig(t, c, rigOpts{mode: mode})
			fine := r.createPod("fine", nil, nil)
			apply(t, fine, rs)
			r.started(fine)
			pods := map[string]*pod{}
			for i, d := range drifts {
				owned := func(p *corev1.Pod) {
					if i%2 == 0 || mode != agent.ModeDelete {
						p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web",
							UID: types.UID("4e1b0c5e-0000-4000-8000-00000000000" + string(rune('0'+i))), Controller: new(bool)}}
						*p.OwnerReferences[0].Controller = true
					}
				}
				p := r.createPod(strings.ReplaceAll(d.name, " ", "-"), nil, owned)
				d.make(t, p, rs)
				r.started(p)
				pods[d.name] = p
			}
			// In delete mode an audit on a pod's own events may already have deleted a drifted
			// pod that has an owner; AuditAll no longer finds those.
			least := len(drifts) + 1
			if mode == agent.ModeDelete {
				least -= (len(drifts) + 1) / 2
			}
			if n := r.a.AuditAll(context.Background()).Audited; n < least || n > len(drifts)+1 {
				t.Errorf("AuditAll looked at %d pods, want %d (at least %d in delete mode)", n, len(drifts)+1, least)
			}
			r.a.AuditAll(context.Background()) // a second pass: nothing new to say

			if evs := r.events(fine); len(evs) != 0 {
				t.Errorf("events on a pod whose rules match: %v", evs)
			}
			for i, d := range drifts {
				p := pods[d.name]
				evs := r.events(p)
				owned := i%2 == 0 || mode != agent.ModeDelete
				switch mode {
				case agent.ModeRepair:
					expectRules(t, p, rs)
					if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning RedirectRepaired RewriteRules: ") || !strings.Contains(evs[0], d.want) {
						t.Errorf("%s: events %q, want one RedirectRepaired naming %q", d.name, evs, d.want)
					}
				case agent.ModeReport:
					if st := show(t, p, rs); st.Match() {
						t.Errorf("%s: report mode changed the rules", d.name)
					}
					if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning RedirectDrift Report: ") || !strings.Contains(evs[0], d.want) {
						t.Errorf("%s: events %q, want one RedirectDrift naming %q", d.name, evs, d.want)
					}
				case agent.ModeDelete:
					if owned == r.podExists(p) {
						t.Errorf("%s: pod exists %v, want deleted %v (owned %v)", d.name, !owned, owned, owned)
					}
					wantEv := "Warning RedirectDrift DeletePod: Deleted pod"
					if !owned {
						wantEv = "Warning RedirectDrift Report: "
					}
					if len(evs) != 1 || !strings.HasPrefix(evs[0], wantEv) || !strings.Contains(evs[0], d.want) {
						t.Errorf("%s: events %q, want one %q naming %q", d.name, evs, wantEv, d.want)
					}
				}
			}
			// Each drift is seen, and healed, exactly once in repair mode, whether the pass or a pod
			// event's audit came first.
			if mode == agent.ModeRepair && (r.metric("pods_drifted_total") != "5" || r.metric("pods_healed_total") != "5") {
				t.Errorf("drifted %s, healed %s; want 5 and 5", r.metric("pods_drifted_total"), r.metric("pods_healed_total"))
			}
			if mode != agent.ModeRepair && r.metric("pods_healed_total") != "0" {
				t.Errorf("mode %s healed %s pods", mode, r.metric("pods_healed_total"))
			}
		})
	}
}

// testInvalidAnnotation: annotations that became invalid after the pod started are named in an
// Event (once), and the pod's rules are left as they are.
func testInvalidAnnotation(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{})
	rs := expected(t, iptables.ModeNFT, nil)
	p := r.createPod("edited", nil, nil)
	apply(t, p, rs)
	r.started(p)
	p.obj.Annotations = map[string]string{cniplugin.AnnotationSkipOutboundPorts: "80,http"}
	updated, err := r.admin.CoreV1().Pods(r.ns).Update(context.Background(), p.obj, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.obj = updated
	waitFor(t, "the Event", func() bool { return len(r.events(p)) > 0 })
	r.a.AuditAll(context.Background())
	evs := r.events(p)
	want := `Warning InvalidAnnotation LeaveRules: The annotations are invalid, so the linkerd-cni agent cannot tell which rules this pod needs; its rules are left as they are: invalid annotation: annotation config.linkerd.io/skip-outbound-ports="80,http" on pod ` + r.ns + `/edited: "http" is not a port number`
	if len(evs) != 1 || evs[0] != want {
		t.Errorf("events %q, want exactly\n%q", evs, want)
	}
	expectRules(t, p, rs)
}

// testValidatorHealed: a pod whose validator failed (it started before the plugin was chained: no
// rules) is healed in place on that status update, without being deleted.
func testValidatorHealed(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{})
	p := r.createPod("unmeshed-start", nil, nil)
	r.started(p)
	p.obj.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: agent.ValidatorContainer, Image: "proxy-init:test", ImageID: "proxy-init@sha256:0",
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 95, Reason: "Error", ContainerID: "containerd://v1",
			StartedAt: metav1.Now(), FinishedAt: metav1.Now()}}}}
	if _, err := r.admin.CoreV1().Pods(r.ns).UpdateStatus(context.Background(), p.obj, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the heal", func() bool { return len(r.events(p)) > 0 })
	expectRules(t, p, expected(t, iptables.ModeNFT, nil))
	if !r.podExists(p) {
		t.Error("the pod was deleted")
	}
	if evs := r.events(p); !slices.ContainsFunc(evs, func(e string) bool { return strings.HasPrefix(e, "Warning RedirectRepaired") }) {
		t.Errorf("events %q, want RedirectRepaired", evs)
	}
}

// testPeriodicAudit: rules flushed by hand come back within one period, with no pod event.
func testPeriodicAudit(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{audit: 500 * time.Millisecond})
	rs := expected(t, iptables.ModeNFT, nil)
	p := r.createPod("flushed", nil, nil)
	apply(t, p, rs)
	r.started(p)
	if _, err := nt.RunIn(t, p.netns, "nft", "flush", "ruleset"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	waitFor(t, "the rules to come back", func() bool { return show(t, p, rs).Match() })
	t.Logf("rules back after %s", time.Since(start).Round(time.Millisecond))
	waitFor(t, "the Event", func() bool { return len(r.events(p)) == 1 })
}
