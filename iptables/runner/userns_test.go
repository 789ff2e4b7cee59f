package runner_test

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// userNSWorld is world with the pod's network namespace owned by a user namespace of its own
// (root there is host UID nt.UserNSHostRoot), as a pod with hostUsers: false has.
func userNSWorld(t *testing.T) *world {
	nt.RequireRoot(t)
	w := &world{Pair: nt.NewUserNSPair(t)}
	w.proxy = nt.StartProxy(t, w.Pod, inboundProxy, outboundProxy)
	for _, port := range []int{appPort, otherAppPort} {
		nt.StartServer(t, w.Pod, nt.HostPort("", port))
	}
	nt.StartServer(t, w.Peer, nt.HostPort("", peerPort))
	return w
}

const userNSReason = "(a pod with hostUsers: false): iptables' owner match is refused there from outside it; writing the native nftables table instead"

// In a pod with its own user namespace the kernel accepts xtables owner-match rules only from
// inside that user namespace, so every mode writes the native table there, chosen before anything
// is written and logged once per operation with the user namespace and why. The proxy's UID is
// the one inside the pod: its host UID is exempt, while a host process with the same number is
// not. Re-applying changes nothing, show matches, cleanup removes everything.
func TestUserNamespacePod(t *testing.T) {
	for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy, iptables.ModePlain, iptables.ModeNFTables, iptables.ModeAuto} {
		t.Run(string(mode), func(t *testing.T) {
			w := userNSWorld(t)
			var log strings.Builder
			tg := target(w, mode)
			tg.Log = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
			cfg := suiteConfig()
			cfg.Mode = mode
			rs, err := iptables.Build(cfg)
			if err != nil {
				t.Fatal(err)
			}
			// chosen checks that the operation just run logged its choice once, as the native
			// table for the pod's user namespace.
			chosen := func(op string) {
				t.Helper()
				lines := strings.Split(strings.TrimSpace(log.String()), "\n")
				var choices []string
				for _, l := range lines {
					if strings.Contains(l, `msg="backend chosen"`) {
						choices = append(choices, l)
					}
				}
				if len(choices) != 1 || !strings.Contains(choices[0], "backend=nftables") || !strings.Contains(choices[0], userNSReason) ||
					!strings.Contains(choices[0], " mode="+string(mode)+" ") || !strings.Contains(choices[0], " userns=user:[") {
					t.Errorf("%s logged the choice %q, want one line naming the native table, the user namespace and why:\n%s", op, choices, log.String())
				}
				log.Reset()
			}
			r := runner.Runner{}
			out, err := r.Apply(context.Background(), tg, rs)
			if err != nil {
				t.Fatalf("apply: %v\n%s", err, log.String())
			}
			if out != (runner.Outcome{Backend: "nftables", Changed: true}) {
				t.Errorf("apply: %+v, want a change written by nftables", out)
			}
			chosen("apply")
			expectOnlyNative(t, w.Pod)
			root := nt.DialOpts{UID: -1, GID: -1}
			inPod := func(id int) int { return nt.UserNSHostRoot + id }
			for _, f := range families {
				w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, root)
				w.expectProxy(t, w.Peer, nt.HostPort(f.pod, appPort), inboundProxy, root)
				expectDirect(t, w.Pod, nt.HostPort(f.peer, peerPort), nt.DialOpts{UID: inPod(proxyUID), GID: -1})
				expectDirect(t, w.Pod, nt.HostPort(f.peer, peerPort), nt.DialOpts{UID: -1, GID: inPod(proxyGID)})
				w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, nt.DialOpts{UID: proxyUID, GID: proxyGID})
				w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, nt.DialOpts{UID: inPod(2000), GID: inPod(2000)})
			}
			if out, err := r.Apply(context.Background(), tg, rs); err != nil || out.Changed {
				t.Errorf("re-apply: %+v, %v; want no change", out, err)
			}
			chosen("re-apply")
			if st, err := r.Show(context.Background(), tg, rs); err != nil || !st.Match() || st.Backend != "nftables" || len(st.Elsewhere) > 0 {
				t.Errorf("show: %+v, %v; want the native table matching, and nothing elsewhere", st, err)
			}
			chosen("show")
			if _, err := r.Cleanup(context.Background(), tg); err != nil {
				t.Fatalf("cleanup: %v", err)
			}
			chosen("cleanup")
			expectNoneOfOurs(t, w.Pod)
			for _, f := range families {
				expectDirect(t, w.Pod, nt.HostPort(f.peer, peerPort), root)
			}
		})
	}
}

// Rules of ours that iptables-nft or iptables-legacy hold in a pod with its own user namespace,
// written from inside it (by the pod's own proxy-init init container, say), go when the Runner
// works there from outside: an apply replaces them with the native table, a cleanup removes them,
// and show reports them as elsewhere.
func TestUserNamespacePodRulesFromInside(t *testing.T) {
	for _, c := range []struct {
		name   string
		inside []string // the restore binaries that wrote the rules from inside
		op     string
	}{
		{"iptables-nft, apply", []string{"iptables-nft-restore", "ip6tables-nft-restore"}, "apply"},
		{"iptables-legacy, apply", []string{"iptables-legacy-restore", "ip6tables-legacy-restore"}, "apply"},
		{"both, cleanup", []string{"iptables-nft-restore", "ip6tables-nft-restore", "iptables-legacy-restore", "ip6tables-legacy-restore"}, "cleanup"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := userNSWorld(t)
			cfg := suiteConfig()
			cfg.Mode = iptables.ModeNFT
			rs, err := iptables.Build(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for _, bin := range c.inside {
				f := iptables.IPv4
				if strings.HasPrefix(bin, "ip6") {
					f = iptables.IPv6
				}
				restoreFromInside(t, w.Pod, bin, iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f)))
			}
			r, tg := runner.Runner{}, target(w, iptables.ModeNFT)
			st, err := r.Show(context.Background(), tg, rs)
			if err != nil || len(st.Elsewhere) == 0 {
				t.Errorf("show: %+v, %v; want the rules from inside reported elsewhere", st, err)
			}
			switch c.op {
			case "apply":
				if _, err := r.Apply(context.Background(), tg, rs); err != nil {
					t.Fatalf("apply: %v", err)
				}
				expectOnlyNative(t, w.Pod)
				for _, f := range families {
					w.expectProxy(t, w.Pod, nt.HostPort(f.peer, peerPort), outboundProxy, nt.DialOpts{UID: -1, GID: -1})
					expectDirect(t, w.Pod, nt.HostPort(f.peer, peerPort), nt.DialOpts{UID: nt.UserNSHostRoot + proxyUID, GID: -1})
				}
			case "cleanup":
				if _, err := r.Cleanup(context.Background(), tg); err != nil {
					t.Fatalf("cleanup: %v", err)
				}
				expectNoneOfOurs(t, w.Pod)
			}
		})
	}
}

// restoreFromInside runs bin --noflush with payload as root of the user namespace that owns the
// pod's network namespace, inside both, as the pod's own init container would.
func restoreFromInside(t *testing.T, pod *nt.NS, bin, payload string) {
	t.Helper()
	netns, err := os.Open(pod.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer netns.Close()
	fd, err := unix.IoctlRetInt(int(netns.Fd()), unix.NS_GET_USERNS)
	if err != nil {
		t.Fatalf("the user namespace of %s: %v", pod.Path(), err)
	}
	userns := os.NewFile(uintptr(fd), "userns")
	defer userns.Close()
	// iptables-legacy locks a file that root of the pod's user namespace may open.
	lock, err := os.CreateTemp("", "xtables-lock-")
	if err != nil {
		t.Fatal(err)
	}
	lock.Close()
	t.Cleanup(func() { os.Remove(lock.Name()) })
	if err := os.Chmod(lock.Name(), 0o666); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("nsenter", "--user=/proc/self/fd/3", "--net="+pod.Path(), "--", bin, "--noflush")
	cmd.ExtraFiles = []*os.File{userns}
	cmd.Env = append(os.Environ(), "XTABLES_LOCKFILE="+lock.Name())
	cmd.Stdin = strings.NewReader(payload)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s from inside the pod's user namespace: %v\n%s\npayload:\n%s", bin, err, out, payload)
	}
}

// expectOnlyNative checks, with the operator's tools, that the pod holds our rules in the native
// table and in no iptables table: `iptables -t nat -S` inside such a pod shows nothing of ours.
func expectOnlyNative(t *testing.T, pod *nt.NS) {
	t.Helper()
	if out, err := nt.RunIn(t, pod, "nft", "list", "table", "inet", iptables.NFTTableName); err != nil || !strings.Contains(out, "skuid") {
		t.Errorf("nft list table inet %s: %v\n%s", iptables.NFTTableName, err, out)
	}
	for _, bin := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		if out, _ := nt.RunIn(t, pod, bin); strings.Contains(out, "PROXY_INIT") {
			t.Errorf("%s shows rules of ours:\n%s", bin, out)
		}
	}
}

// expectNoneOfOurs checks that no backend holds rules of ours in the pod.
func expectNoneOfOurs(t *testing.T, pod *nt.NS) {
	t.Helper()
	for _, bin := range []string{"iptables-nft-save", "ip6tables-nft-save", "iptables-legacy-save", "ip6tables-legacy-save"} {
		if out, _ := nt.RunIn(t, pod, bin); strings.Contains(out, "PROXY_INIT") {
			t.Errorf("%s still shows rules of ours:\n%s", bin, out)
		}
	}
	if out, _ := nt.RunIn(t, pod, "nft", "list", "ruleset"); strings.Contains(out, iptables.NFTTableName) {
		t.Errorf("the native table is still there:\n%s", out)
	}
}
