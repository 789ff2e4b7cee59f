package hygiene

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// TestArm64BuildRuns holds the arm64 build (GOARCH=arm64, a plain go build without cgo, as the
// images' arm64 binaries are) to working on arm64, under qemu-user-static: every command answers
// version, and proxy-init --iptables-mode auto writes the Linkerd chart's rules into a pod's
// namespace, which the host's iptables-legacy-save then lists. qemu-user refuses the nf_tables
// netlink socket (NETLINK_NETFILTER) and rtnetlink's ip rules, so auto writes with
// iptables-legacy there (the host's amd64 binaries, which the emulated process execs natively)
// and skips the backends the socket refusal leaves it unable to reach, instead of failing after
// it wrote; show and cleanup then agree. Only the legacy path can run under qemu-user.
func TestArm64BuildRuns(t *testing.T) {
	nt.RequireRoot(t, "the arm64 proxy-init writes into a namespace it creates")
	qemu, err := exec.LookPath("qemu-aarch64-static")
	if err != nil {
		t.Fatalf("%v (make deps installs qemu-user-static)", err)
	}
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir, "./cmd/...")
	build.Dir = "../.."
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOARCH=arm64", "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("GOARCH=arm64 go build -o DIR ./cmd/...: %v\n%s", err, out)
	}
	entries, err := os.ReadDir(dir)
	if err != nil || len(entries) < 2 {
		t.Fatalf("the arm64 build holds %v (%v); want proxy-init and linkerd-cni at least", entries, err)
	}
	for _, e := range entries {
		out, err := runPlain(t, qemu, nil, filepath.Join(dir, e.Name()), "version")
		if err != nil || !strings.HasPrefix(out, e.Name()+" ") || !strings.Contains(out, "linux/arm64") {
			t.Errorf("qemu-aarch64-static %s version: %v, %q; want its name and linux/arm64", e.Name(), err, out)
		}
	}

	ns := nt.NewNS(t)
	proxyInit := []string{filepath.Join(dir, "proxy-init")}
	chart := []string{"--iptables-mode", "auto", "--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102",
		"--inbound-ports-to-ignore", "4190,4191,4567,4568", "--outbound-ports-to-ignore", "4567,4568", "--log-level", "debug"}
	run := func(args ...string) string {
		t.Helper()
		stdout, stderr := nt.Output(t, ns, "", qemu, append(proxyInit, args...)...)
		return stdout + stderr
	}
	out := run(chart...)
	for _, want := range []string{`msg="backend fallback" mode_from=--iptables-mode backend=iptables-legacy`,
		"open the nf_tables netlink socket: the kernel offers no interface for this backend: socket: protocol not supported",
		`msg="backend skipped: the kernel offers no interface for it, so it holds nothing of ours"`, `msg="rules applied" backend=iptables-legacy`} {
		if !strings.Contains(out, want) {
			t.Errorf("the apply under qemu does not say %q:\n%s", want, out)
		}
	}
	saved, _ := nt.Output(t, ns, "", "iptables-legacy-save", "-t", "nat")
	for _, want := range []string{"-A OUTPUT -m comment --comment \"proxy-init/install-proxy-init-output\" -j PROXY_INIT_OUTPUT",
		"-A PROXY_INIT_OUTPUT -m owner --uid-owner 2102 -m comment --comment \"proxy-init/ignore-proxy-user-id\" -j RETURN",
		"-A PROXY_INIT_REDIRECT -p tcp -m comment --comment \"proxy-init/redirect-all-incoming-to-proxy-port\" -j REDIRECT --to-ports 4143"} {
		if !strings.Contains(saved, want) {
			t.Errorf("iptables-legacy-save -t nat lacks %q:\n%s", want, saved)
		}
	}
	if out := run(append([]string{"show"}, chart...)...); !strings.Contains(out, "rules match the configuration") {
		t.Errorf("proxy-init show under qemu:\n%s", out)
	}
	run("cleanup")
	if saved, _ := nt.Output(t, ns, "", "iptables-legacy-save", "-t", "nat"); strings.Contains(saved, "PROXY_INIT") {
		t.Errorf("left after cleanup under qemu:\n%s", saved)
	}
}
