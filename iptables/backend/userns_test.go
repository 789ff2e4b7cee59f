package backend_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/kubemesh/proxy-init/internal/cnitest"
	nt "github.com/kubemesh/proxy-init/internal/netnstest"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/backend"
)

var helper struct {
	once sync.Once
	dir  string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if helper.dir != "" {
		os.RemoveAll(helper.dir)
	}
	os.Exit(code)
}

// helperExe is proxy-init built as make build builds it, entry hook included: the helper the
// Runner starts for a pod with its own user namespace. (This test binary has no hook.)
func helperExe(t *testing.T) string {
	t.Helper()
	helper.once.Do(func() {
		if helper.dir, helper.err = os.MkdirTemp("", "backend-userns-helper-"); helper.err == nil {
			helper.err = cnitest.GoBuild(helper.dir, "github.com/kubemesh/proxy-init/cmd/proxy-init")
		}
	})
	if helper.err != nil {
		t.Fatal(helper.err)
	}
	return helper.dir + "/proxy-init"
}

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

// In a pod with its own user namespace the kernel accepts owner-match rules only from inside it.
// Every mode writes working rules there: the xtables modes from the helper inside the pod's user
// namespace, nftables and auto (native nftables, whose skuid match maps the UID in the pod's user
// namespace) in place. The proxy's UID is the one inside the pod: its host UID is exempt, while a
// host process with the same number is not. Re-applying changes nothing, show matches, cleanup
// removes everything.
func TestUserNamespacePod(t *testing.T) {
	for _, c := range []struct {
		mode    iptables.Mode
		backend string
	}{
		{iptables.ModeNFT, "iptables-nft"},
		{iptables.ModeLegacy, "iptables-legacy"},
		{iptables.ModePlain, ""},
		{iptables.ModeNFTables, "nftables"},
		{iptables.ModeAuto, "nftables"},
	} {
		t.Run(string(c.mode), func(t *testing.T) {
			w := userNSWorld(t)
			var log strings.Builder
			r := backend.Runner{Helper: helperExe(t)}
			tg := target(w, c.mode)
			tg.Log = slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelDebug}))
			cfg := suiteConfig()
			cfg.Mode = c.mode
			rs, err := iptables.Build(cfg)
			if err != nil {
				t.Fatal(err)
			}
			out, err := r.Apply(context.Background(), tg, rs)
			if err != nil {
				t.Fatalf("apply: %v\n%s", err, log.String())
			}
			if !out.Changed || (c.backend != "" && out.Backend != c.backend) {
				t.Errorf("apply: %+v, want a change written by %s", out, c.backend)
			}
			var wantLog []string
			switch c.mode {
			case iptables.ModeNFT, iptables.ModeLegacy, iptables.ModePlain:
				// The helper chose the backend, and its log reached ours.
				wantLog = []string{"writing from a helper inside it", `msg="backend chosen" userns=user:[`}
			case iptables.ModeAuto:
				wantLog = []string{`msg="backend fallback"`, "belongs to user namespace user:[", "accepts owner-match rules there only from inside it"}
			}
			for _, want := range wantLog {
				if !strings.Contains(log.String(), want) {
					t.Errorf("the log does not say %q:\n%s", want, log.String())
				}
			}
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
			if st, err := r.Show(context.Background(), tg, rs); err != nil || !st.Match() {
				t.Errorf("show: %+v, %v", st, err)
			}
			if _, err := r.Cleanup(context.Background(), tg); err != nil {
				t.Fatalf("cleanup: %v", err)
			}
			st, err := r.Show(context.Background(), tg, rs)
			if err != nil {
				t.Fatalf("show after cleanup: %v", err)
			}
			for _, fs := range st.Families {
				if len(fs.Rules) > 0 {
					t.Errorf("after cleanup %s still has %q", fs.Family, fs.Rules)
				}
			}
			for _, f := range families {
				expectDirect(t, w.Pod, nt.HostPort(f.peer, peerPort), root)
			}
		})
	}
}

// A helper that cannot enter the pod's user namespace (here: a binary linked without the entry
// hook) fails the write with an error that names the namespaces, why, and the modes that need no
// helper, and nothing is written.
func TestUserNamespacePodWithoutHelper(t *testing.T) {
	w := userNSWorld(t)
	rs, err := iptables.Build(suiteConfig())
	if err != nil {
		t.Fatal(err)
	}
	r := backend.Runner{Helper: os.Args[0]}
	for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy, iptables.ModePlain} {
		_, err := r.Apply(context.Background(), target(w, mode), rs)
		if err == nil {
			t.Fatalf("%s: apply through a helper without the entry hook succeeded", mode)
		}
		for _, want := range []string{
			"network namespace " + w.Pod.Path() + " belongs to user namespace user:[",
			fmt.Sprintf("iptables mode %s writes owner-match rules", mode),
			"linked without its entry hook (go build -ldflags=-E=github.com/kubemesh/proxy-init/internal/netnsutil.entry",
			"iptables mode nftables (or auto) writes there without entering it",
		} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%s: the error does not say %q:\n%v", mode, want, err)
			}
		}
	}
	for _, cmd := range [][]string{{"iptables-nft-save", "-t", "nat"}, {"iptables-legacy-save", "-t", "nat"}, {"nft", "list", "ruleset"}} {
		if got, _ := nt.RunIn(t, w.Pod, cmd[0], cmd[1:]...); strings.Contains(got, "PROXY_INIT") || strings.Contains(got, "proxy_init") {
			t.Errorf("%s shows rules after the refused writes:\n%s", cmd[0], got)
		}
	}
}
