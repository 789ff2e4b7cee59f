package proxyinit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/nfnl"
	"github.com/kubemesh/proxy-init/iptables/runner"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// refusing is a backend on a kernel without TPROXY: it refuses the rules whole, writing none.
type refusing struct{ iptables.Applier }

func (refusing) Apply(context.Context, *iptables.Ruleset) (iptables.Result, error) {
	return iptables.Result{}, fmt.Errorf("the kernel refused the rule tproxy-all-incoming-to-proxy-port: %w", syscall.ENOENT)
}

// --inbound-mode tproxy on a kernel without TPROXY: exit 1, the error names what is missing for
// the mode, and nothing is written, neither rules nor the policy routing added before them.
// This machine's kernel has both TPROXYs (nfnl's TestProbeTPROXYWritesNothing), so the
// backend's refusal and the probe's answer are stood in for those of one that lacks them; the
// rest (the namespace, the policy routing and its removal, the backend choice) is real.
func TestTPROXYWithoutKernelSupport(t *testing.T) {
	nt.RequireRoot(t)
	lacking := func(context.Context) (nfnl.TPROXYSupport, error) {
		return nfnl.TPROXYSupport{XTErr: syscall.ENOENT, NativeErr: syscall.ENOENT}, nil
	}
	r := runner.Runner{Kernel: runner.CheckKernelWith(runner.Probes{TPROXY: lacking}), Choose: func(o runner.Options) (iptables.Applier, string, error) {
		a, why, err := runner.New(o)
		return refusing{a}, why, err
	}}
	const (
		xt     = "iptables' TPROXY target (xt_TPROXY, CONFIG_NETFILTER_XT_TARGET_TPROXY): no such file or directory"
		native = "nftables' tproxy expression (nft_tproxy, CONFIG_NFT_TPROXY): no such file or directory"
	)
	for _, c := range []struct {
		mode iptables.Mode
		want string
	}{
		{iptables.ModeLegacy, xt},
		{iptables.ModeNFT, xt},
		{iptables.ModeNFTables, native},
		{iptables.ModeAuto, xt + ", or " + native},
	} {
		t.Run(string(c.mode), func(t *testing.T) {
			n := nt.NewNS(t)
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), chartArgs("--inbound-mode", "tproxy", "--iptables-mode", string(c.mode), "--netns", n.Path()), &stdout, &stderr, r)
			want := fmt.Sprintf("inbound-mode tproxy: the kernel lacks support for TPROXY in iptables mode %s, which needs %s; nothing was written", c.mode, c.want)
			if code != ExitFailure || !strings.Contains(stderr.String(), want) {
				t.Errorf("exit %d, want %d; stderr lacks %q:\n%s", code, ExitFailure, want, stderr.String())
			}
			if left := written(t, n); left != "" {
				t.Errorf("written:\n%s", left)
			}
			// The control: with the real kernel's answer the same command line writes rules and
			// policy routing, which written sees, and cleanup removes them all.
			stderr.Reset()
			args := chartArgs("--inbound-mode", "tproxy", "--iptables-mode", string(c.mode), "--netns", n.Path())
			if code := run(context.Background(), args, &stdout, &stderr, runner.Runner{}); code != ExitOK {
				t.Fatalf("with the real kernel: exit %d\n%s", code, stderr.String())
			}
			if w := written(t, n); !strings.Contains(w, "ip rule") || !strings.Contains(w, "route") {
				t.Errorf("with the real kernel, written sees no policy routing:\n%s", w)
			}
			// show covers the policy routing: it matches, and a deleted ip rule is named.
			show := func() (int, string) {
				stdout.Reset()
				code := run(context.Background(), append([]string{"show"}, args...), &stdout, &stderr, runner.Runner{})
				return code, stdout.String()
			}
			if code, out := show(); code != ExitOK || !strings.Contains(out, "policy routing: 4 lines in place, match") {
				t.Errorf("show: exit %d\n%s", code, out)
			}
			if err := n.Do(func() error {
				return netlink.RuleDel(&netlink.Rule{Family: netlink.FAMILY_V4, Priority: iptables.TPROXYRulePriority, Table: int(iptables.TPROXYTable),
					Mark: iptables.TPROXYMark, Mask: nil, Goto: -1, Flow: -1, SuppressIfgroup: -1, SuppressPrefixlen: -1})
			}); err != nil {
				t.Fatal(err)
			}
			if code, out := show(); code != ExitFailure || !strings.Contains(out, "missing: ip -4 rule: priority 4143 fwmark 0x102f lookup 4143") {
				t.Errorf("show with the ip rule deleted: exit %d\n%s", code, out)
			}
			if code := run(context.Background(), []string{"cleanup", "--netns", n.Path()}, &stdout, &stderr, runner.Runner{}); code != ExitOK {
				t.Fatalf("cleanup: exit %d\n%s", code, stderr.String())
			}
			if w := written(t, n); strings.Contains(w, "ip rule") || strings.Contains(w, "route:") || strings.Contains(w, "proxy_init") {
				t.Errorf("left after cleanup:\n%s", w)
			}
		})
	}
}

// written reports anything in the namespace: a legacy table instantiated, an nf_tables table,
// an ip rule or route beyond the kernel's own.
func written(t *testing.T, n *nt.NS) string {
	t.Helper()
	var out []string
	if err := n.Do(func() error {
		for _, f := range []string{"/proc/thread-self/net/ip_tables_names", "/proc/thread-self/net/ip6_tables_names"} {
			b, err := os.ReadFile(f)
			if err != nil && !errors.Is(err, fs.ErrNotExist) {
				return err
			}
			if s := strings.TrimSpace(string(b)); s != "" {
				out = append(out, "legacy tables: "+s)
			}
		}
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rules, err := netlink.RuleList(fam)
			if err != nil {
				return err
			}
			for _, r := range rules {
				if r.Table == int(iptables.TPROXYTable) {
					out = append(out, fmt.Sprintf("ip rule: %v", r))
				}
			}
			routes, err := netlink.RouteListFiltered(fam, &netlink.Route{Table: int(iptables.TPROXYTable)}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return err
			}
			for _, r := range routes {
				out = append(out, fmt.Sprintf("route: %v", r))
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if s, err := nt.RunIn(t, n, "nft", "list", "ruleset"); err != nil || strings.TrimSpace(s) != "" {
		out = append(out, fmt.Sprintf("nft list ruleset: %s %v", s, err))
	}
	return strings.Join(out, "\n")
}

// A kernel without the legacy ip_tables (Linux 6.17 and later unless built with
// CONFIG_NETFILTER_XTABLES_LEGACY: Talos 1.12, Alpine): --iptables-mode legacy stays legacy and
// fails, exit 1, with an error that names the kernel options and the modes that work, and writes
// nothing. The real iptables-legacy-restore meets such a kernel through strace, which refuses its
// socket option with ENOPROTOOPT as that kernel does, and says only "unable to initialize table
// 'nat'"; the probe's answer (no /proc/net/ip_tables_names, the same refusal) is stood in for.
// The control runs the same command line against the real kernel.
func TestLegacyWithoutKernelSupport(t *testing.T) {
	nt.RequireRoot(t)
	dir := t.TempDir()
	for _, bin := range []string{"iptables-legacy-restore", "ip6tables-legacy-restore"} {
		real, err := exec.LookPath(bin)
		if err != nil {
			t.Fatalf("%v (make deps installs iptables)", err)
		}
		script := "#!/bin/sh\nexec strace -qq -o /dev/null -e trace=getsockopt -e inject=getsockopt:error=ENOPROTOOPT " + real + " \"$@\"\n"
		if err := os.WriteFile(filepath.Join(dir, bin), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := exec.LookPath("strace"); err != nil {
		t.Fatalf("%v (make deps installs strace)", err)
	}
	missing := func(f iptables.Family) error {
		file, opt := "/proc/net/ip_tables_names", "IPT_SO_GET_INFO"
		if f == iptables.IPv6 {
			file, opt = "/proc/net/ip6_tables_names", "IP6T_SO_GET_INFO"
		}
		return fmt.Errorf("no %s, and the socket option %s is refused: %w", file, opt, syscall.ENOPROTOOPT)
	}
	r := runner.Runner{Kernel: runner.CheckKernelWith(runner.Probes{Legacy: missing})}
	for _, c := range []struct {
		name string
		args []string
		want string
	}{
		{"dual-stack", nil, "ipv4: no /proc/net/ip_tables_names, and the socket option IPT_SO_GET_INFO is refused: protocol not available; " +
			"ipv6: no /proc/net/ip6_tables_names, and the socket option IP6T_SO_GET_INFO is refused: protocol not available"},
		{"ipv4 only", []string{"--ipv6=false"}, "ipv4: no /proc/net/ip_tables_names, and the socket option IPT_SO_GET_INFO is refused: protocol not available"},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := nt.NewNS(t)
			args := chartArgs(append([]string{"--iptables-mode", "legacy", "--netns", n.Path()}, c.args...)...)
			var stdout, stderr bytes.Buffer
			t.Setenv("PATH", dir+":"+os.Getenv("PATH"))
			code := run(context.Background(), args, &stdout, &stderr, r)
			for _, want := range []string{
				"iptables mode legacy: the kernel lacks support for iptables-legacy (" + c.want + "): kernels from Linux 6.17 have the legacy " +
					"ip_tables and ip6_tables only when built with CONFIG_NETFILTER_XTABLES_LEGACY and CONFIG_IP_NF_IPTABLES_LEGACY / " +
					"CONFIG_IP6_NF_IPTABLES_LEGACY, and elsewhere their modules may not be loaded; iptables mode auto or nft writes the " +
					"same rules over nf_tables; nothing was written",
				"unable to initialize table 'nat'", // the binary's own words, kept after ours
			} {
				if code != ExitFailure || !strings.Contains(stderr.String(), want) {
					t.Errorf("exit %d, want %d; stderr lacks %q:\n%s", code, ExitFailure, want, stderr.String())
				}
			}
			if left := written(t, n); left != "" {
				t.Errorf("written:\n%s", left)
			}
			// The control: the real kernel's answer, whatever the restore said, is that legacy is
			// there, so the binary's error stands alone; with the real binaries the rules go in.
			stderr.Reset()
			if code := run(context.Background(), args, &stdout, &stderr, runner.Runner{}); code != ExitFailure || strings.Contains(stderr.String(), "lacks support") {
				t.Errorf("the real kernel's answer: exit %d\n%s", code, stderr.String())
			}
			t.Setenv("PATH", strings.TrimPrefix(os.Getenv("PATH"), dir+":"))
			if code := run(context.Background(), args, &stdout, &stderr, runner.Runner{}); code != ExitOK {
				t.Fatalf("with the real binaries: exit %d\n%s", code, stderr.String())
			}
		})
	}
}
