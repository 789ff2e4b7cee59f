package agent_test

// What a pod author can do to its own pod, and what it must not do to the node: hold its
// namespace's lock, or edit the annotations of a running pod.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/agent"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/kubetest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// stateDir is the rig's state directory: the plugin's and the agent's lock files and records.
func (r *rig) stateDir() string { return filepath.Dir(r.socket) }

// addPod creates a meshed pod, runs the plugin's ADD for it (rules and record written, as on a
// node) and makes its sandbox known to the agent's finder.
func (r *rig) addPod(name string, annotations map[string]string) *pod {
	r.t.Helper()
	p := r.createPod(name, annotations, nil)
	if add := r.run("ADD", r.args(p, r.conf)); add.err != nil {
		r.t.Fatalf("ADD %s: %v\n%s", name, add.err, add.stderr)
	}
	r.started(p)
	return p
}

// holdInPodLock starts, in p's namespace, a process of user nobody that takes flock on its own
// /proc/self/ns/net, as any process of a pod can, and holds it until the test ends.
func holdInPodLock(t testing.TB, p *pod) {
	t.Helper()
	hold(t, p.netns.Path(), &syscall.Credential{Uid: 65534, Gid: 65534}, "/proc/self/ns/net")
	waitFor(t, "the pod's own process to hold its namespace's lock", func() bool {
		unlock, err := runner.Lock(p.netns.Path(), true, 0)
		if err == nil {
			unlock()
		}
		return err != nil
	})
}

// hostLockFile is the host lock file of the namespace at netns: named after its nsfs device and
// inode.
func (r *rig) hostLockFile(netns string) string {
	r.t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(netns, &st); err != nil {
		r.t.Fatal(err)
	}
	return filepath.Join(r.stateDir(), cniplugin.LocksDir, fmt.Sprintf("%d-%d", st.Dev, st.Ino))
}

// holdHostLock starts a process on the node, root, that holds p's host lock file until the test
// ends. (Not while the agent sweeps: the file could go between the process's open and its flock.)
func (r *rig) holdHostLock(p *pod) string {
	r.t.Helper()
	file := r.hostLockFile(p.netns.Path())
	hold(r.t, "", nil, file)
	waitFor(r.t, "the node's process to hold the host lock", func() bool {
		l, err := runner.HostLock(filepath.Dir(file), p.netns.Path(), true, 0)
		if err == nil {
			l.Release()
		}
		return err != nil
	})
	return file
}

// hold runs flock(1) on file in the namespace at netns ("" the test's own), as cred (nil: root),
// killed with its child at cleanup.
func hold(t testing.TB, netns string, cred *syscall.Credential, file string) {
	t.Helper()
	cmd := exec.Command("flock", "--exclusive", file, "sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Setpgid: true}
	if err := netnsutil.Do(netns, cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
}

// testLockedNamespaces: pods whose own unprivileged process holds flock on their namespace hold
// up nothing: their ADD, their audits (a heal included) and the node's other audits run as usual.
// Pods whose host lock another process of the node holds are given up on after the audits' short
// wait, counted, and reported once each, while the other 110 pods are all audited in the same
// pass.
func testLockedNamespaces(t *testing.T, c *kubetest.Cluster) {
	const others, inPod, host = 110, 4, 3
	r := newRig(t, c, rigOpts{})
	rs := expected(t, iptables.ModeNFT, nil)
	for i := range others {
		r.addPod(fmt.Sprintf("other-%03d", i), nil)
	}
	var held []*pod
	for i := range inPod + host {
		p := r.createPod(fmt.Sprintf("locked-%d", i), nil, nil)
		holdInPodLock(t, p) // before ADD: the plugin does not wait for it either
		if add := r.run("ADD", r.args(p, r.conf)); add.err != nil || add.took > 5*time.Second {
			t.Fatalf("ADD with the pod's own process holding the in-pod lock: %v (took %s)\n%s", add.err, add.took, add.stderr)
		}
		r.started(p)
		held = append(held, p)
	}
	// The in-pod holders' rules go missing: the audit must rewrite them, under their lock.
	for _, p := range held[:inPod] {
		if _, err := nt.RunIn(t, p.netns, "nft", "flush", "ruleset"); err != nil {
			t.Fatal(err)
		}
	}
	locks := map[types.UID]string{}
	for _, p := range held[inPod:] {
		locks[p.obj.UID] = r.holdHostLock(p)
	}
	waitFor(t, "the agent's queue to drain", func() bool { return r.metric("queue_size") == "0" })
	busyBefore := r.metric("audit_lock_busy_total")

	for range 2 {
		pass := r.a.AuditAll(context.Background())
		if pass.Audited != others+inPod || pass.Busy != host {
			t.Errorf("pass: %d audited, %d busy; want %d audited (the in-pod holders among them) and %d busy", pass.Audited, pass.Busy, others+inPod, host)
		}
	}
	for _, p := range held[:inPod] {
		// Read as the agent reads: under the host lock (the pod's process holds the in-pod one).
		st, err := runner.Runner{}.Show(context.Background(), runner.Target{NetNS: p.netns.Path(), Options: runner.Options{Mode: rs.mode},
			HostLockDir: filepath.Join(r.stateDir(), cniplugin.LocksDir)}, rs.rs)
		if err != nil || !st.Match() || len(st.Families) == 0 {
			t.Errorf("%s: rules not healed under its pod's lock: %v %+v", p.obj.Name, err, st)
		}
	}
	if got, want := r.metric("audit_lock_busy_total"), fmt.Sprint(mustAtoi(t, busyBefore)+2*host); got != want {
		t.Errorf("audit_lock_busy_total %s, want %s (two passes, %d pods held)", got, want, host)
	}
	for _, p := range held[inPod:] {
		evs := r.events(p)
		if len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning "+agent.ReasonLockBusy+" Report: ") ||
			!strings.Contains(evs[0], "within 1s") || !strings.Contains(evs[0], "Lock: "+locks[p.obj.UID]) {
			t.Errorf("%s: events %q, want one %s naming the 1s wait and %s", p.obj.Name, evs, agent.ReasonLockBusy, locks[p.obj.UID])
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if s != "" {
		if _, err := fmt.Sscan(s, &n); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
	}
	return n
}

// testAnnotationEdits: a running pod's annotations (and its namespace's) are those its sandbox
// was set up with. An edit that would take its outbound redirect away is reported once, with a
// metric, and not applied: in repair mode the rules stay (and a drift is healed back to them), in
// delete mode the pod is not deleted. A pod without a record is checked against its current
// annotations, which the agent says once.
func testAnnotationEdits(t *testing.T, c *kubetest.Cluster) {
	for _, mode := range []agent.Mode{agent.ModeRepair, agent.ModeDelete} {
		t.Run(string(mode), func(t *testing.T) {
			r := newRig(t, c, rigOpts{mode: mode})
			rs := expected(t, iptables.ModeNFT, func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"3306"} })
			p := r.addPod("edited", map[string]string{cniplugin.AnnotationSkipOutboundPorts: "3306"})
			owned(t, r, p)
			waitFor(t, "the agent's queue to drain", func() bool { return r.metric("queue_size") == "0" })
			expectRules(t, p, rs)

			r.annotatePod(p, cniplugin.AnnotationSkipOutboundPorts, "1-65535")
			waitFor(t, "the Event", func() bool { return len(r.events(p)) > 0 })
			r.annotateNamespace(cniplugin.AnnotationSkipInboundPorts, "1-65535")
			waitFor(t, "the second Event", func() bool { return len(r.events(p)) > 1 })
			if mode == agent.ModeRepair {
				if _, err := nt.RunIn(t, p.netns, "nft", "flush", "ruleset"); err != nil {
					t.Fatal(err)
				}
			}
			r.a.AuditAll(context.Background())
			r.a.AuditAll(context.Background())

			if !r.podExists(p) {
				t.Fatal("the pod was deleted for an annotation edit")
			}
			expectRules(t, p, rs) // in repair mode, healed back to the recorded settings
			var edits []string
			for _, e := range r.events(p) {
				if strings.HasPrefix(e, "Warning "+agent.ReasonEdited+" Report: ") {
					edits = append(edits, e)
				}
			}
			wantEdits := []string{
				`config.linkerd.io/skip-outbound-ports (was "3306", now "1-65535")`,
				`config.linkerd.io/skip-inbound-ports (was unset, now "1-65535")`,
			}
			if all := strings.Join(edits, "\n"); len(edits) != 2 || !strings.Contains(all, wantEdits[0]) || !strings.Contains(all, wantEdits[1]) {
				t.Errorf("events %q, want two %s, naming %q", r.events(p), agent.ReasonEdited, wantEdits)
			}
			if got := r.metric("annotation_edits_total"); got != "2" {
				t.Errorf("annotation_edits_total %s, want 2", got)
			}
		})
	}
	t.Run("no record", func(t *testing.T) {
		r := newRig(t, c, rigOpts{})
		p := r.createPod("old", map[string]string{cniplugin.AnnotationSkipOutboundPorts: "3306"}, nil)
		r.started(p) // set up before records were kept: no ADD of this version
		r.annotatePod(p, cniplugin.AnnotationSkipOutboundPorts, "5432")
		waitFor(t, "the agent's queue to drain", func() bool { return r.metric("queue_size") == "0" })
		r.a.AuditAll(context.Background())
		r.a.AuditAll(context.Background())
		expectRules(t, p, expected(t, iptables.ModeNFT, func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"5432"} }))
		if n := strings.Count(r.log.String(), "no record of the settings the pod's sandbox was set up with"); n != 1 {
			t.Errorf("said %d times that the pod has no record, want once", n)
		}
	})
}

// owned gives p a controller, so that delete mode would delete it.
func owned(t *testing.T, r *rig, p *pod) {
	t.Helper()
	isController := true
	p.obj.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web",
		UID: "4e1b0c5e-0000-4000-8000-0000000000aa", Controller: &isController}}
	updated, err := r.admin.CoreV1().Pods(r.ns).Update(context.Background(), p.obj, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	p.obj = updated
}

func (r *rig) annotatePod(p *pod, key, value string) {
	r.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, key, value)
	updated, err := r.admin.CoreV1().Pods(r.ns).Patch(context.Background(), p.obj.Name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	if err != nil {
		r.t.Fatal(err)
	}
	p.obj = updated
}

func (r *rig) annotateNamespace(key, value string) {
	r.t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, key, value)
	if _, err := r.admin.CoreV1().Namespaces().Patch(context.Background(), r.ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		r.t.Fatal(err)
	}
}

// testSweep: what the plugin leaves for a sandbox gone without a DEL (its record, its lock file,
// a temporary file of a write cut short) goes at the next audit period; a lock file held, and the
// record of a pod still on the node, stay.
func testSweep(t *testing.T, c *kubetest.Cluster) {
	r := newRig(t, c, rigOpts{audit: 300 * time.Millisecond})
	// On the node, its sandbox not (yet) known to the finder: its record stays, and no audit
	// enters its namespace while the test removes it.
	live := r.createPod("live", nil, nil)
	if add := r.run("ADD", r.args(live, r.conf)); add.err != nil {
		t.Fatalf("ADD: %v\n%s", add.err, add.stderr)
	}
	records := filepath.Join(r.stateDir(), cniplugin.RecordsDir)
	locks := filepath.Join(r.stateDir(), cniplugin.LocksDir)
	old := time.Now().Add(-time.Hour)
	stale := map[string]string{
		filepath.Join(records, "sandbox-gone.json"):       `{"v":1,"pod":"` + r.ns + `/gone","podUID":"0000","inputs":{}}`,
		filepath.Join(records, ".tmp-sandbox-x.json-123"): `{"v":1`,
		filepath.Join(locks, "4-4026530000"):              "",
	}
	for path, body := range stale {
		if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, old, old); err != nil {
			t.Fatal(err)
		}
	}
	liveRecord := filepath.Join(records, live.id+".json")
	if err := os.Chtimes(liveRecord, old, old); err != nil {
		t.Fatal(err)
	}
	l, err := runner.HostLock(locks, "/proc/self/ns/net", true, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	heldLock := r.hostLockFile("/proc/self/ns/net")
	waitFor(t, "the sweep", func() bool {
		for path := range stale {
			if _, err := os.Stat(path); err == nil {
				return false
			}
		}
		return true
	})
	for _, path := range []string{liveRecord, heldLock} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("swept what is in use: %v", err)
		}
	}
}
