package runner_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// lockDir is a host lock directory of the test's own: its parent is the test's, mode 0700.
func lockDir(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "locks")
}

// Any process in a pod can hold the in-pod lock: flock on its own /proc/self/ns/net, unprivileged.
// Writers on the host take the host lock instead, which it cannot reach: they write at once, while
// a writer taking the in-pod lock (alone, or after the host one, as proxy-init --netns does)
// gives up after its wait, naming the lock.
func TestAPodCannotHoldTheHostLock(t *testing.T) {
	nt.RequireRoot(t)
	n := nt.NewNS(t)
	holder := exec.Command("flock", "--exclusive", "/proc/self/ns/net", "sleep", "600")
	holder.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}, Setpgid: true}
	if err := netnsutil.Do(n.Path(), holder.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-holder.Process.Pid, syscall.SIGKILL)
		_ = holder.Wait()
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		unlock, err := runner.Lock(n.Path(), true, 0)
		if err != nil {
			break
		}
		unlock()
		if time.Now().After(deadline) {
			t.Fatal("the pod's process never took its namespace's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}

	rs := buildRules(t, iptables.ModeNFTables)
	dir := lockDir(t)
	tests := []struct {
		name   string
		target runner.Target
		busy   string // the lock named, or "" when the write goes through
	}{
		{"host lock", runner.Target{HostLockDir: dir}, ""},
		{"in-pod lock", runner.Target{}, "the namespace's own file, which any process in the pod can hold too"},
		{"host lock, then in-pod lock", runner.Target{HostLockDir: dir, InPodLock: true}, "the namespace's own file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.target.NetNS, tt.target.Mode, tt.target.LockWait = n.Path(), iptables.ModeNFTables, 200*time.Millisecond
			_, err := runner.Runner{}.Apply(context.Background(), tt.target, rs)
			var busy *runner.BusyError
			switch {
			case tt.busy == "" && err != nil:
				t.Errorf("Apply: %v", err)
			case tt.busy != "" && (!errors.As(err, &busy) || !strings.Contains(busy.Lock, tt.busy)):
				t.Errorf("Apply: %v; want a busy lock naming %q", err, tt.busy)
			case tt.busy != "" && err.Error() != fmt.Sprintf("another proxy-init or linkerd-cni is still writing rules in this network namespace after 200ms; gave up waiting (lock: %s)", busy.Lock):
				t.Errorf("message %q", err)
			}
		})
	}
}

func buildRules(t *testing.T, mode iptables.Mode) *iptables.Ruleset {
	t.Helper()
	rs, err := iptables.Build(iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1, Mode: mode})
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// The host lock lets one holder in at a time, however its file is removed meanwhile: by a
// holder's Remove (a DEL) or by a sweep, while others wait for it.
func TestHostLockExcludesAcrossRemovals(t *testing.T) {
	dir := lockDir(t)
	var inside, entries, overlaps atomic.Int64
	stop := make(chan struct{})
	var sweeps sync.WaitGroup
	sweeps.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := runner.SweepHostLocks(dir); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var holders sync.WaitGroup
	for i := range 8 {
		holders.Go(func() {
			for j := range 100 {
				l, err := runner.HostLock(dir, "/proc/self/ns/net", true, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				entries.Add(1)
				time.Sleep(50 * time.Microsecond)
				inside.Add(-1)
				if (i+j)%3 == 0 {
					if err := l.Remove(); err != nil {
						t.Error(err)
					}
				} else {
					l.Release()
				}
			}
		})
	}
	holders.Wait()
	close(stop)
	sweeps.Wait()
	if overlaps.Load() != 0 || entries.Load() != 800 {
		t.Errorf("%d of %d entries overlapped another holder", overlaps.Load(), entries.Load())
	}
}

// SweepHostLocks removes the lock files nobody holds, and nothing else.
func TestSweepHostLocks(t *testing.T) {
	dir := lockDir(t)
	held, err := runner.HostLock(dir, "/proc/self/ns/net", false, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	// Only names of lock files (digits, '-', digits) are swept.
	others := []string{"notes.txt", "4-", "-4026531111", "4-4026531111-1", "4-40265x"}
	for _, f := range append([]string{"4-4026531111"}, others...) {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	n, err := runner.SweepHostLocks(dir)
	if err != nil || n != 1 {
		t.Errorf("swept %d, %v; want 1", n, err)
	}
	left, _ := os.ReadDir(dir)
	if len(left) != 1+len(others) || slices.ContainsFunc(left, func(e os.DirEntry) bool { return e.Name() == "4-4026531111" }) {
		t.Errorf("left %v; want the held lock and %q", left, others)
	}
	if n, err := runner.SweepHostLocks(filepath.Join(t.TempDir(), "none")); n != 0 || err != nil {
		t.Errorf("a missing directory: %d, %v", n, err)
	}
}

// The host lock's directory and file are refused when anyone else may reach them, naming what is
// wrong, and no lock file is made.
func TestHostLockRefusesWhatOthersReach(t *testing.T) {
	tests := []struct {
		name  string
		spoil func(t *testing.T, dir string)
		want  string
	}{
		{"directory open to others", func(t *testing.T, dir string) {
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, 0o755); err != nil {
				t.Fatal(err)
			}
		}, "the namespace locks' directory: refusing %s: mode 0755 gives others access (want at most 0700)"},
		{"directory a symbolic link", func(t *testing.T, dir string) {
			if err := os.Symlink(t.TempDir(), dir); err != nil {
				t.Fatal(err)
			}
		}, "the namespace locks' directory: refusing %s: not a directory (mode Lrwxrwxrwx)"},
		{"lock file a symbolic link", func(t *testing.T, dir string) {
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			var st syscall.Stat_t
			if err := syscall.Stat("/proc/self/ns/net", &st); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/etc/hostname", filepath.Join(dir, fmt.Sprintf("%d-%d", st.Dev, st.Ino))); err != nil {
				t.Fatal(err)
			}
		}, "open the lock file: open %s/"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := lockDir(t)
			tt.spoil(t, dir)
			before, _ := os.ReadDir(dir)
			_, err := runner.HostLock(dir, "/proc/self/ns/net", true, time.Second)
			if want := fmt.Sprintf(tt.want, dir); err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("HostLock: %v; want %q", err, want)
			}
			if after, _ := os.ReadDir(dir); len(after) != len(before) {
				t.Errorf("HostLock made %v", after)
			}
		})
	}
}

// A program started under the host lock inherits it, as under the in-pod lock
// (TestLockIsInheritedByChildren).
func TestHostLockIsInheritedByChildren(t *testing.T) {
	dir := lockDir(t)
	l, err := runner.HostLock(dir, "/proc/self/ns/net", true, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command("sleep", "1")
	if err := child.Start(); err != nil {
		l.Release()
		t.Fatal(err)
	}
	l.Release() // as if the writer were killed: only the child holds the lock now
	var busy *runner.BusyError
	if _, err := runner.HostLock(dir, "/proc/self/ns/net", true, 100*time.Millisecond); !errors.As(err, &busy) {
		t.Errorf("took the lock while the child holds it: %v", err)
	}
	if err := child.Wait(); err != nil {
		t.Fatal(err)
	}
	again, err := runner.HostLock(dir, "/proc/self/ns/net", true, time.Second)
	if err != nil {
		t.Fatalf("lock still held after the child exited: %v", err)
	}
	again.Release()
}
