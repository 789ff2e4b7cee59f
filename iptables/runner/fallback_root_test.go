package runner_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// refuseNetlinkWriter makes the kernel refuse iptables-nft's rules in the namespace, the way a
// kernel without one of their extensions would: the ip6 nat table holds a filter chain under our
// chain's name, where a jump and REDIRECT are refused.
func refuseNetlinkWriter(t *testing.T, n *nt.NS) {
	t.Helper()
	if out, err := nt.RunIn(t, n, "nft", "add table ip6 nat; add chain ip6 nat PROXY_INIT_OUTPUT { type filter hook output priority 0; }"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
}

// Where the kernel refuses iptables-nft's rules over netlink, auto writes the native nftables
// table instead, and says why in a warning; the refused transaction wrote nothing.
func TestAutoFallsBackWhenTheKernelRefuses(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	refuseNetlinkWriter(t, n)
	rs, err := iptables.Build(suiteConfig())
	if err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	target := runner.Target{NetNS: n.Path(), Options: runner.Options{Mode: iptables.ModeAuto}, Log: slog.New(slog.NewTextHandler(&log, nil))}
	out, err := runner.Runner{}.Apply(context.Background(), target, rs)
	if err != nil {
		t.Fatalf("auto apply: %v", err)
	}
	if out.Backend != "nftables" {
		t.Errorf("auto wrote with %s, want the native nftables table", out.Backend)
	}
	for _, want := range []string{`msg="backend fallback"`, "passed over iptables-nft over netlink", "the kernel does not support this backend", "operation not supported"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("the log does not say %q:\n%s", want, log.String())
		}
	}
	if got, _ := nt.RunIn(t, n, "iptables-nft-save", "-t", "nat"); strings.Contains(got, "PROXY_INIT") {
		t.Errorf("the refused transaction left iptables-nft rules:\n%s", got)
	}
	if st, err := (runner.Runner{}).Show(context.Background(), target, rs); err != nil || !st.Match() || st.Backend != "nftables" {
		t.Errorf("show after the fallback: %+v, %v", st, err)
	}
}

// Where the kernel refuses iptables-nft's rules over netlink, the nft mode runs the
// iptables-nft binaries, and reports both attempts when they fail too.
func TestNFTFallsBackToTheBinaries(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	refuseNetlinkWriter(t, n)
	rs, err := iptables.Build(suiteConfig())
	if err != nil {
		t.Fatal(err)
	}
	_, err = runner.Runner{}.Apply(context.Background(), runner.Target{NetNS: n.Path(), Options: runner.Options{Mode: iptables.ModeNFT}}, rs)
	if err == nil {
		t.Fatal("nft apply succeeded over a chain the kernel refuses our rules in")
	}
	for _, want := range []string{"ip6tables-nft-restore", "after passing over iptables-nft over netlink", "operation not supported"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q:\n%v", want, err)
		}
	}
	if got, _ := nt.RunIn(t, n, "iptables-nft-save", "-t", "nat"); strings.Contains(got, "PROXY_INIT") {
		t.Errorf("the failed apply left IPv4 rules (no rollback):\n%s", got)
	}
}
