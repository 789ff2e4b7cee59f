package netnsutil_test

import (
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/kubemesh/proxy-init/internal/cnitest"
	"github.com/kubemesh/proxy-init/internal/netnstest"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
)

// ForeignUserNS finds the pods with a user namespace of their own, and only them.
func TestForeignUserNS(t *testing.T) {
	plain := netnstest.NewNS(t)
	pod := netnstest.NewUserNS(t)
	for _, path := range []string{"", "/proc/self/ns/net", plain.Path()} {
		if owner, err := netnsutil.ForeignUserNS(path); owner != nil || err != nil {
			t.Errorf("ForeignUserNS(%q) = %v, %v; want nil: our own user namespace owns it", path, owner, err)
		}
	}
	owner, err := netnsutil.ForeignUserNS(pod.Path())
	if err != nil || owner == nil {
		t.Fatalf("ForeignUserNS(%s) = %v, %v; want its user namespace", pod.Path(), owner, err)
	}
	defer owner.Close()
	var holder string
	if err := pod.Do(func() error {
		out, err := exec.Command("sh", "-c", "readlink /proc/$$/ns/user; cat /proc/$$/uid_map").Output()
		holder = string(out)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if label := netnsutil.NSLabel(owner); !strings.HasPrefix(label, "user:[") || label == strings.TrimSpace(holder) {
		t.Errorf("NSLabel = %q; a process that only entered the network namespace is in %s", label, holder)
	}
	if _, err := netnsutil.ForeignUserNS("/nonexistent/netns"); err == nil || !strings.Contains(err.Error(), "/nonexistent/netns") {
		t.Errorf("a missing netns: %v, want an error naming it", err)
	}
}

// build builds the commands (as make build does, or without the entry hook) into a directory.
func build(t *testing.T, hook bool, goarch string, pkgs ...string) string {
	t.Helper()
	dir := t.TempDir()
	if hook && goarch == "" {
		if err := cnitest.GoBuild(dir, pkgs...); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	ldflags := "-s -w"
	if hook {
		ldflags = netnsutil.EntryHookFlag // unstripped, for the symbol table
	}
	cmd := exec.Command("go", append([]string{"build", "-trimpath", "-ldflags", ldflags, "-o", dir + "/"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if goarch != "" {
		cmd.Env = append(cmd.Env, "GOARCH="+goarch)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, out)
	}
	return dir
}

func runBin(t *testing.T, env []string, bin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatal(err)
	}
	return code, o.String(), e.String()
}

// A binary linked without the entry hook refuses to start, naming the flag: a bad build shows on
// its first run, not on the first pod with its own user namespace. The CNI plugin fails every
// command but DEL, which never fails.
func TestBuildWithoutTheHookRefusesToStart(t *testing.T) {
	const why = "this binary was linked without its entry hook (go build -ldflags=-E=github.com/kubemesh/proxy-init/internal/netnsutil.entry; make build passes it)"
	pi := "github.com/kubemesh/proxy-init/cmd/proxy-init"
	cni := "github.com/kubemesh/proxy-init/cmd/linkerd-cni"
	without := build(t, false, "", pi, cni)
	with := build(t, true, "", pi, cni)
	for _, c := range []struct {
		bin  string
		args []string
		env  []string
		code int
		out  string
		err  string
	}{
		{"proxy-init", []string{"version"}, nil, 1, "", "proxy-init: refusing to start: " + why + "\n"},
		{"linkerd-cni", []string{"version"}, nil, 1, "", "linkerd-cni: refusing to start: " + why + "\n"},
		{"linkerd-cni", nil, []string{"CNI_COMMAND=ADD"}, 1, `"code": 50`, ""},
		{"linkerd-cni", nil, []string{"CNI_COMMAND=DEL"}, 0, "", ""},
	} {
		code, stdout, stderr := runBin(t, c.env, filepath.Join(without, c.bin), c.args...)
		if code != c.code || !strings.Contains(stdout, c.out) || (c.err != "" && stderr != c.err) || (c.out != "" && !strings.Contains(stdout, why)) {
			t.Errorf("%s %v %v without the hook: exit %d, stdout %q, stderr %q; want exit %d, %q, %q",
				c.bin, c.env, c.args, code, stdout, stderr, c.code, c.out, c.err)
		}
	}
	for _, bin := range []string{"proxy-init", "linkerd-cni"} {
		if code, _, stderr := runBin(t, nil, filepath.Join(with, bin), "version"); code != 0 {
			t.Errorf("%s version with the hook: exit %d: %s", bin, code, stderr)
		}
	}
}

// The linker makes the hook the entry point on both architectures the images are built for.
func TestHookIsTheEntryPoint(t *testing.T) {
	for _, arch := range []string{"amd64", "arm64"} {
		dir := build(t, true, arch, "github.com/kubemesh/proxy-init/cmd/proxy-init")
		f, err := elf.Open(filepath.Join(dir, "proxy-init"))
		if err != nil {
			t.Fatal(err)
		}
		syms, err := f.Symbols()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		// The assembly routine itself: its symbol is the ABI0 one (the plain name is Go's
		// wrapper for calls from Go, which would expect a Go stack).
		found := false
		for _, s := range syms {
			if s.Name == netnsutil.EntryHookSymbol+".abi0" {
				found = true
				if s.Value != f.Entry {
					t.Errorf("%s: entry point %#x, the hook is at %#x", arch, f.Entry, s.Value)
				}
			}
		}
		if !found {
			t.Errorf("%s: no symbol %s", arch, netnsutil.EntryHookSymbol)
		}
	}
}

// The helper's Go side reports what the hook recorded: which step failed, and why.
func TestHelperReportsTheHooksFailure(t *testing.T) {
	netnstest.RequireRoot(t, "starts the helper in namespaces it creates")
	bin := filepath.Join(build(t, true, "", "github.com/kubemesh/proxy-init/cmd/proxy-init"), "proxy-init")
	// Where nobody may run it: t.TempDir's directories are root's alone.
	for dir := filepath.Dir(bin); dir != os.TempDir(); dir = filepath.Dir(dir) {
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	pod := netnstest.NewUserNS(t)
	owner, err := netnsutil.ForeignUserNS(pod.Path())
	if err != nil || owner == nil {
		t.Fatalf("ForeignUserNS: %v, %v", owner, err)
	}
	defer owner.Close()
	devNull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devNull.Close()
	for _, c := range []struct {
		name   string
		userns *os.File
		netns  string
		nobody bool
		want   string
	}{
		{"no user namespace on fd 3", devNull, pod.Path(), false, "join the pod's user namespace: setns: invalid argument"},
		{"no network namespace on fd 4", owner, os.DevNull, false, "join the pod's network namespace: setns: invalid argument"},
		{"no CAP_SYS_ADMIN", owner, pod.Path(), true, "join the pod's user namespace: setns: operation not permitted (this needs CAP_SYS_ADMIN)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cmd, done, err := netnsutil.HelperCommand(context.Background(), bin, c.userns, c.netns)
			if err != nil {
				t.Fatal(err)
			}
			defer done()
			if c.nobody {
				cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
			}
			var out bytes.Buffer
			cmd.Stdin, cmd.Stdout = strings.NewReader("{}"), &out
			if err := cmd.Run(); err == nil {
				t.Error("the helper succeeded")
			}
			if !strings.Contains(out.String(), c.want) || !strings.Contains(out.String(), `"Entering":true`) {
				t.Errorf("the helper answered %s, want an entering error %q", out.String(), c.want)
			}
		})
	}
}

// What every write in the modes nft, legacy and plain pays to learn that a pod has no user
// namespace of its own (docs/performance.md).
func BenchmarkForeignUserNS(b *testing.B) {
	n := netnstest.NewNS(b)
	for b.Loop() {
		if owner, err := netnsutil.ForeignUserNS(n.Path()); owner != nil || err != nil {
			b.Fatal(owner, err)
		}
	}
}
