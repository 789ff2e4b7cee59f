package main_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// TestNFTModeExecsNothing traces every process proxy-init starts: in nft mode (named, or chosen
// by the Linkerd chart's iptables-nft paths) and in auto mode, apply, show and cleanup execute no
// program, although the iptables-nft binaries are on PATH.
func TestNFTModeExecsNothing(t *testing.T) {
	nt.RequireRoot(t)
	strace, err := exec.LookPath("strace")
	if err != nil {
		t.Fatalf("strace is needed to trace proxy-init (make deps installs it): %v", err)
	}
	if _, err := exec.LookPath("iptables-nft-restore"); err != nil {
		t.Fatalf("the test proves nothing without iptables-nft-restore on PATH: %v", err)
	}
	for name, modeArgs := range map[string][]string{
		"nft":         {"--iptables-mode", "nft"},
		"chart-paths": {"--firewall-bin-path", "iptables-nft", "--firewall-save-bin-path", "iptables-nft-save"},
		"auto":        nil,
	} {
		t.Run(name, func(t *testing.T) {
			ns := newNS(t)
			for _, cmd := range []string{"apply", "show", "cleanup"} {
				trace := filepath.Join(t.TempDir(), "trace")
				a := args(modeArgs, []string{"--netns", ns}, chart)
				if cmd != "apply" {
					a = append([]string{cmd}, a...)
				}
				r := runWrapped(t, []string{strace, "-f", "-qq", "-e", "trace=execve,execveat", "-o", trace}, a...)
				if r.code != 0 {
					t.Fatalf("%s: exit %d\n%s%s", cmd, r.code, r.stdout, r.stderr)
				}
				data, err := os.ReadFile(trace)
				if err != nil {
					t.Fatal(err)
				}
				var execs []string
				for _, l := range strings.Split(string(data), "\n") {
					if strings.Contains(l, "execve(") || strings.Contains(l, "execveat(") {
						execs = append(execs, l)
					}
				}
				if len(execs) != 1 || !strings.Contains(execs[0], binary) {
					t.Errorf("%s executed more than proxy-init itself:\n%s", cmd, strings.Join(execs, "\n"))
				}
			}
			if out := saveNat(t, ns, "iptables-nft-save"); strings.Contains(out, "PROXY_INIT") {
				t.Errorf("rules left after cleanup:\n%s", out)
			}
		})
	}
}

// TestMissingCapability runs proxy-init without CAP_NET_ADMIN (or, for iptables-legacy, without
// CAP_NET_RAW), dropped from its bounding set by setpriv before it starts. In every mode, apply,
// show and cleanup exit 1 with a message that names the capability and the namespace; show lists
// nothing as missing; auto does not fall back to another backend; nothing is written.
func TestMissingCapability(t *testing.T) {
	nt.RequireRoot(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) drops the capability: %v", err)
	}
	for _, c := range []struct {
		mode string
		drop string   // the capability dropped, as setpriv names it
		want []string // what the message must name
	}{
		{"auto", "net_admin", []string{"CAP_NET_ADMIN", "grant the container NET_ADMIN"}},
		{"nft", "net_admin", []string{"CAP_NET_ADMIN"}},
		{"nftables", "net_admin", []string{"CAP_NET_ADMIN"}},
		{"plain", "net_admin", []string{"CAP_NET_ADMIN"}},
		{"legacy", "net_admin", []string{"CAP_NET_ADMIN and CAP_NET_RAW", "lacks CAP_NET_ADMIN"}},
		{"legacy", "net_raw", []string{"CAP_NET_ADMIN and CAP_NET_RAW", "lacks CAP_NET_RAW"}},
	} {
		t.Run(c.mode+"-without-"+c.drop, func(t *testing.T) {
			ns := newNS(t)
			var st syscall.Stat_t
			if err := syscall.Stat(ns, &st); err != nil {
				t.Fatal(err)
			}
			nsID := fmt.Sprintf("network namespace net:[%d]", st.Ino)
			drop := []string{setpriv, "--inh-caps=-" + c.drop, "--bounding-set=-" + c.drop}
			for _, cmd := range []string{"apply", "show", "cleanup"} {
				a := args([]string{"--netns", ns, "--iptables-mode", c.mode}, chart)
				if cmd != "apply" {
					a = append([]string{cmd}, a...)
				}
				r := runWrapped(t, drop, a...)
				if r.code != 1 {
					t.Errorf("%s: exit %d, want 1\n%s%s", cmd, r.code, r.stdout, r.stderr)
				}
				for _, w := range append(c.want, nsID, "permission denied") {
					if !strings.Contains(r.stderr, w) {
						t.Errorf("%s: the error does not say %q:\n%s", cmd, w, r.stderr)
					}
				}
				if r.stdout != "" {
					t.Errorf("%s printed rules it could not read:\n%s", cmd, r.stdout)
				}
				if c.mode == "auto" && (strings.Contains(r.stderr, "passed over") || strings.Contains(r.stderr, "unable to initialize")) {
					t.Errorf("%s: auto fell back on a permission error:\n%s", cmd, r.stderr)
				}
			}
			assertPristine(t, ns)
		})
	}
}
