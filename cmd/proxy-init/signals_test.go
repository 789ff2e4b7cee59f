package main_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// TestSignalsIgnoredWhileWriting signals proxy-init with SIGTERM and SIGINT while it is inside
// apply or cleanup, waiting for the namespace's lock, which the test holds: it carries on, writes
// once the lock is free, and exits 0. (The settings are main's; package proxyinit changes
// nothing process-wide.)
func TestSignalsIgnoredWhileWriting(t *testing.T) {
	nt.RequireRoot(t)
	for _, cmd := range []string{"apply", "cleanup"} {
		t.Run(cmd, func(t *testing.T) {
			ns := newNS(t)
			if cmd == "cleanup" {
				mustRun(t, 0, args([]string{"--netns", ns, "--iptables-mode", "nft"}, chart)...)
			}
			unlock := holdLock(t, ns)
			a := args([]string{"--netns", ns, "--iptables-mode", "nft"}, chart)
			if cmd != "apply" {
				a = append([]string{cmd}, a...)
			}
			c := exec.Command(binary, a...)
			var out strings.Builder
			c.Stdout, c.Stderr = &out, &out
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- c.Wait() }()
			t.Cleanup(func() {
				if c.ProcessState == nil {
					_ = c.Process.Kill()
				}
			})
			waitInNamespace(t, c.Process.Pid, ns)
			for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
				if err := c.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case err := <-exited:
				t.Fatalf("proxy-init %s ended on a signal while it waited to write: %v\n%s", cmd, err, out.String())
			case <-time.After(300 * time.Millisecond):
			}
			unlock()
			select {
			case err := <-exited:
				if err != nil {
					t.Fatalf("proxy-init %s: %v\n%s", cmd, err, out.String())
				}
			case <-time.After(20 * time.Second):
				t.Fatalf("proxy-init %s did not finish once the lock was free:\n%s", cmd, out.String())
			}
			saved := saveNat(t, ns, "iptables-nft-save")
			if has := strings.Contains(saved, "PROXY_INIT_OUTPUT"); has != (cmd == "apply") {
				t.Errorf("after %s, iptables-nft-save:\n%s", cmd, saved)
			}
		})
	}
}

// holdLock holds the namespace's lock (exclusive) from another process, flock(1), until the
// returned function is called: held by the test itself, the lock would pass to proxy-init with
// the descriptor, which children inherit on purpose (see runner.Lock).
func holdLock(t *testing.T, nsPath string) func() {
	t.Helper()
	c := exec.Command("flock", "--exclusive", nsPath, "cat")
	stdin, err := c.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(); err != nil {
		t.Fatalf("flock (util-linux) holds the lock: %v", err)
	}
	release := func() {
		stdin.Close()
		_ = c.Wait()
	}
	t.Cleanup(release)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		f, err := os.Open(nsPath)
		if err != nil {
			t.Fatal(err)
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return release
		}
		if time.Now().After(deadline) {
			t.Fatalf("flock did not take the lock of %s: %v", nsPath, err)
		}
	}
}

// waitInNamespace waits until process pid holds the network namespace at nsPath open twice, to
// be in it and to wait for its lock: it is inside the runner, so main has long made its
// settings.
func waitInNamespace(t *testing.T, pid int, nsPath string) {
	t.Helper()
	// The descriptor names the bind mount's path (symbolic links resolved).
	want, err := filepath.EvalSymlinks(nsPath)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		open := 0
		for _, fd := range fds {
			if l, _ := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name())); l == want {
				open++
			}
		}
		if open >= 2 {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("proxy-init (pid %d) never opened %s", pid, nsPath)
}
