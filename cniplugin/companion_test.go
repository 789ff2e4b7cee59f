package cniplugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
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
