package cniplugin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/iptables"
)

// withPluginDir runs f with libcni finding linkerd-cni in dir first (the other plugins where
// they are), as a runtime would on a node whose CNI bin dir is dir.
func (n *node) withPluginDir(t *testing.T, dir string, f func()) {
	t.Helper()
	stderr, err := os.OpenFile(filepath.Join(n.dir, "plugins.stderr"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	saved := n.cni
	defer func() { n.cni = saved }()
	n.cni = libcni.NewCNIConfigWithCacheDir(append([]string{dir}, binDirs[1:]...), filepath.Join(n.dir, "cache"),
		&invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: stderr}})
	f()
}

// copyFile copies the file at src to dst with mode.
func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, b, mode); err != nil {
		t.Fatal(err)
	}
}

// testCompanionBroken: the node's plugin with its companion missing, not executable, not a
// program, or crashing. A call that must read the API fails with an error naming the companion
// and why (ADD and CHECK with CNI code 11, try again later; STATUS with 50, plugin not
// available), logged with the pod; nothing is written and no API request is made. What needs no
// API works as before: a pod in an excluded namespace passes through, and DEL removes the rules.
func testCompanionBroken(t *testing.T, n *node) {
	ns := "companion"
	n.createNamespace(t, ns, nil)
	n.createPod(t, ns, "web", shapeClassic, nil, nil)
	list := n.conflist(t, netOpts{mode: iptables.ModeNFTables})
	excluded := n.conflist(t, netOpts{mode: iptables.ModeNFTables, top: map[string]any{"exclude-namespaces": []string{ns}}})
	real := filepath.Join(binDirs[0], cniplugin.CompanionName)
	for _, tt := range []struct {
		name string
		make func(path string) // lays out the companion at path
		why  string            // what the error says after "failed: "
	}{
		{"missing", func(string) {}, "fork/exec %s: no such file or directory"},
		{"not executable", func(p string) { copyFile(t, real, p, 0o644) }, "fork/exec %s: permission denied"},
		{"not a program", func(p string) {
			if err := os.WriteFile(p, []byte("not an ELF file\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "fork/exec %s: exec format error"},
		{"crashes", func(p string) {
			if err := os.WriteFile(p, []byte("#!/bin/sh\necho 'panic: boom' >&2\nexit 2\n"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "exit status 2; its last line on stderr: panic: boom"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			copyFile(t, filepath.Join(binDirs[0], "linkerd-cni"), filepath.Join(dir, "linkerd-cni"), 0o755)
			companion := filepath.Join(dir, cniplugin.CompanionName)
			tt.make(companion)
			why := strings.ReplaceAll(tt.why, "%s", companion)
			// A pod with rules, written while the companion worked.
			written := n.newSandbox(t, ns, "web")
			n.mustAdd(t, list, written)
			time.Sleep(time.Second) // the audit log is written asynchronously
			before := len(n.apiEvents(t, ns))

			n.withPluginDir(t, dir, func() {
				sb := n.newSandbox(t, ns, "web")
				_, err := n.add(t, list, sb)
				want := "pod companion/web might be meshed and cannot be looked up: the plugin's API fallback " + companion +
					" failed: " + why + " (the linkerd-cni installer copies it beside the plugin)"
				var ce *types.Error
				if !errors.As(err, &ce) || ce.Code != types.ErrTryAgainLater || ce.Msg != want {
					t.Errorf("ADD: %#v\nwant code %d and message\n%s", err, types.ErrTryAgainLater, want)
				}
				expectUntouched(t, sb)
				if log := n.logTail(sb.rt.ContainerID); !strings.Contains(log, `level=ERROR msg=failed cmd=ADD pod=web namespace=companion containerID=`+sb.rt.ContainerID) ||
					!strings.Contains(log, companion) {
					t.Errorf("the failure is not logged with the pod and the companion:\n%s", log)
				}
				if err := n.check(list, written); err == nil || !strings.Contains(err.Error(), why) {
					t.Errorf("CHECK: %v; want a failure saying %q", err, why)
				}
				err = n.inNode(func(ctx context.Context) error { return n.cni.GetStatusNetworkList(ctx, list) })
				if !errors.As(err, &ce) || ce.Code != types.ErrPluginNotAvailable || !strings.Contains(ce.Msg, "linkerd-cni cannot look pods up: the plugin's API fallback "+companion+" failed: "+why) {
					t.Errorf("STATUS: %v; want code %d naming the companion", err, types.ErrPluginNotAvailable)
				}

				// Needing no API, these work without the companion.
				n.expectPassThrough(t, excluded, n.newSandbox(t, ns, "web"))
				if err := n.del(list, written); err != nil {
					t.Errorf("DEL: %v", err)
				}
				expectNoRules(t, written)
			})
			time.Sleep(time.Second) // the audit log is written asynchronously
			if evs := n.apiEvents(t, ns); len(evs) != before {
				t.Errorf("%d API requests without a working companion, want none: %v", len(evs)-before, eventURIs(evs[before:]))
			}
		})
	}
}

// TestCompanionPassThrough runs the node's plugin binary with stand-ins for its companion: the
// companion gets the plugin's standard input and environment byte for byte, its result and its
// CNI error are the plugin's, and it dies with the plugin when the runtime kills the plugin.
func TestCompanionPassThrough(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the plugin binary: skipped with -short")
	}
	stdin := []byte(`{"cniVersion":"1.0.0","name":"k8s","type":"linkerd-cni","agent":{"socket":""},` +
		`"kubernetes":{"kubeconfig":"/nonexistent"},"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140}}`)
	env := []string{"CNI_COMMAND=ADD", "CNI_CONTAINERID=c1", "CNI_NETNS=/nonexistent/netns", "CNI_IFNAME=eth0",
		"CNI_ARGS=K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0", "CNI_PATH=/opt/cni/bin", "OTHER=kept"}
	run := func(t *testing.T, script string) (dir string, stdout string, code int) {
		t.Helper()
		dir = t.TempDir()
		copyFile(t, filepath.Join(pluginBinaries(t)[0], "linkerd-cni"), filepath.Join(dir, "linkerd-cni"), 0o755)
		if err := os.WriteFile(filepath.Join(dir, cniplugin.CompanionName), []byte("#!/bin/sh\n"+script), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(dir, "linkerd-cni"))
		cmd.Env, cmd.Stdin = append(env, "DIR="+dir), bytes.NewReader(stdin)
		out, err := cmd.Output()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return dir, string(out), code
	}

	t.Run("a result", func(t *testing.T) {
		const result = `{"cniVersion":"1.0.0","interfaces":[{"name":"eth0"}]}`
		dir, out, code := run(t, `cat > "$DIR/stdin"; env > "$DIR/env"; printf '%s' '`+result+`'`)
		if code != 0 || out != result {
			t.Errorf("exit %d, stdout %q; want 0 and the companion's %q", code, out, result)
		}
		if got, _ := os.ReadFile(filepath.Join(dir, "stdin")); !bytes.Equal(got, stdin) {
			t.Errorf("the companion's stdin %q, want the plugin's %q", got, stdin)
		}
		got, _ := os.ReadFile(filepath.Join(dir, "env"))
		for _, kv := range append(env, "DIR="+dir) {
			if !strings.Contains("\n"+string(got), "\n"+kv+"\n") {
				t.Errorf("the companion's environment lacks %s:\n%s", kv, got)
			}
		}
	})
	t.Run("a CNI error", func(t *testing.T) {
		const cniErr = `{"code":11,"msg":"pod web/api-0 might be meshed and cannot be looked up: get pod web/api-0: timed out"}`
		_, out, code := run(t, `printf '%s' '`+cniErr+`'; exit 1`)
		var got, want types.Error
		if err := json.Unmarshal([]byte(out), &got); err != nil {
			t.Fatalf("stdout %q: %v", out, err)
		}
		_ = json.Unmarshal([]byte(cniErr), &want)
		if code != 1 || got != want {
			t.Errorf("exit %d, error %+v; want 1 and the companion's %+v", code, got, want)
		}
	})
	t.Run("no result", func(t *testing.T) {
		dir, out, code := run(t, `exit 0`)
		want := "exited 0 without printing a result"
		if code != 1 || !strings.Contains(out, `"code": 11`) || !strings.Contains(out, filepath.Join(dir, cniplugin.CompanionName)+" failed: "+want) {
			t.Errorf("exit %d, stdout %s; want 1 and error 11 saying %q", code, out, want)
		}
	})
	t.Run("killed with the plugin", func(t *testing.T) {
		dir := t.TempDir()
		copyFile(t, filepath.Join(pluginBinaries(t)[0], "linkerd-cni"), filepath.Join(dir, "linkerd-cni"), 0o755)
		if err := os.WriteFile(filepath.Join(dir, cniplugin.CompanionName), []byte("#!/bin/sh\necho $$ > \"$DIR/pid\"\nexec sleep 60\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(filepath.Join(dir, "linkerd-cni"))
		cmd.Env, cmd.Stdin = append(env, "DIR="+dir), bytes.NewReader(stdin)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		var pid int
		deadline := time.Now().Add(10 * time.Second)
		for pid == 0 && time.Now().Before(deadline) {
			b, _ := os.ReadFile(filepath.Join(dir, "pid"))
			pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
			time.Sleep(10 * time.Millisecond)
		}
		if pid == 0 {
			_ = cmd.Process.Kill()
			t.Fatal("the companion never started")
		}
		t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // only if the test failed
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		for time.Now().Before(deadline) && syscall.Kill(pid, 0) == nil {
			time.Sleep(10 * time.Millisecond)
		}
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("the companion (pid %d) outlived the plugin", pid)
		}
	})
}
