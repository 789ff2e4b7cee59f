package agent_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	nt "github.com/kubemesh/proxy-init/internal/netnstest"
	"github.com/kubemesh/proxy-init/iptables"
)

// BenchmarkAudit prints, for `make bench` (-benchtime 1x: it repeats by itself), the time of one
// audit pass over 110 meshed pods on one node (the kubelet's default pod limit) and the API
// requests the pass makes, with every pod's rules in place, then with every pod's rules flushed
// (the pass heals them all). The pods' namespaces are found by the test's finder: the CRI's part
// (one list per pod, one status per new sandbox) is not in these figures.
func BenchmarkAudit(b *testing.B) {
	const pods, passes = 110, 5
	c := startCluster(b)
	r := newRig(b, c, rigOpts{})
	want := expected(b, iptables.ModeNFT, nil)
	var all []*pod
	for i := range pods {
		p := r.createPod(fmt.Sprintf("web-%03d", i), nil, nil)
		apply(b, p, want)
		r.started(p)
		all = append(all, p)
	}
	// Let the pod events' own audits drain first.
	waitFor(b, "the agent's queue to drain", func() bool { return r.metric("queue_size") == "0" })
	time.Sleep(2 * time.Second)
	requests := func() int {
		evs, err := c.AuditEvents(r.user)
		if err != nil {
			b.Fatal(err)
		}
		return len(evs)
	}
	pass := func() (time.Duration, int) {
		before := requests()
		start := time.Now()
		n := r.a.AuditAll(context.Background())
		took := time.Since(start)
		if n != pods {
			b.Fatalf("the pass audited %d pods, want %d", n, pods)
		}
		time.Sleep(time.Second) // the audit log is written asynchronously
		return took, requests() - before
	}
	var clean []time.Duration
	cleanRequests := 0
	for range passes {
		d, n := pass()
		clean = append(clean, d)
		cleanRequests += n
	}
	for _, p := range all {
		if _, err := nt.RunIn(b, p.netns, "nft", "flush", "ruleset"); err != nil {
			b.Fatal(err)
		}
	}
	heal, healRequests := pass()
	for _, p := range all {
		if st := show(b, p, want); !st.Match() {
			b.Fatalf("%s not healed", p.obj.Name)
		}
	}
	slices.Sort(clean)
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("\nlinkerd-cni agent audit, %d meshed pods on one node, nft mode, local kube-apiserver (load average %s):\n",
		pods, strings.Join(strings.Fields(string(load))[:3], " "))
	fmt.Printf("  %-48s %8s  (%.2fms per pod; %d passes, range %s-%s)  API requests per pass %.1f\n", "one pass, every pod's rules in place",
		msec(clean[len(clean)/2]), float64(clean[len(clean)/2].Microseconds())/1000/pods, passes, msec(clean[0]), msec(clean[len(clean)-1]),
		float64(cleanRequests)/passes)
	fmt.Printf("  %-48s %8s  (%.2fms per pod)  API requests %d (%d Events, one per healed pod)\n", "one pass healing every pod",
		msec(heal), float64(heal.Microseconds())/1000/pods, healRequests, pods)
}

func msec(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d.Microseconds())/1000) }
