package main

// Copies of the built binary under Linkerd's names, run as Linkerd's charts run them.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/kubemesh/proxy-init/cniplugin/repair"
	"github.com/kubemesh/proxy-init/internal/multicall"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/test/cnitest"
	"github.com/kubemesh/proxy-init/test/kubetest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// buildAs builds this command once per test into a fresh directory and copies it under name.
func buildAs(t *testing.T, name string) string {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "linkerd-cni")
	if err := cnitest.GoBuild(dir, "."); err != nil {
		t.Fatal(err)
	}
	if name == "linkerd-cni" {
		return bin
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, name)
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestLinkerdNames runs a copy of the binary under every name in the multicall table: each
// linkerd-cni name runs its subcommand, and proxy-init's names are refused.
func TestLinkerdNames(t *testing.T) {
	bin := buildAs(t, "linkerd-cni")
	for _, n := range multicall.Names {
		t.Run(n.Name, func(t *testing.T) {
			// A hard link: the same file as a copy would be, under its own name.
			named := filepath.Join(filepath.Dir(bin), n.Name)
			if err := os.Link(bin, named); err != nil {
				t.Fatal(err)
			}
			var stdout, stderr bytes.Buffer
			cmd := exec.Command(named, "--help")
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			var want string
			switch {
			case n.Program != multicall.LinkerdCNI:
				want = fmt.Sprintf("linkerd-cni: %s is a name of the proxy-init binary, not of linkerd-cni: install proxy-init under it\n", n.Name)
				if code != 2 || stderr.String() != want {
					t.Errorf("exit %d, stderr %q; want 2, %q", code, stderr.String(), want)
				}
				return
			case n.Subcommand == "repair":
				want = "linkerd-cni repair deletes the pods"
			case n.Subcommand == "install":
				want = "Usage of linkerd-cni install:"
			}
			if code != 0 || !strings.Contains(stdout.String()+stderr.String(), want) {
				t.Errorf("exit %d, output:\n%s%s\nwant the help of %s (%q)", code, stdout.String(), stderr.String(), n.Subcommand, want)
			}
		})
	}
}

// TestLinkerdRepairControllerCommandLine runs Linkerd's linkerd2-cni chart's repair-controller
// container as the chart writes it (command, args and environment) against a real kube-apiserver,
// in the cluster's own network namespace: it serves /live and /ready on the chart's probe port
// and reads the chart's default log filter.
func TestLinkerdRepairControllerCommandLine(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping in -short mode: starts etcd and kube-apiserver (run `make kube-bins` first)")
	}
	nt.RequireRoot(t)
	c := kubetest.Start(t, kubetest.Options{NetNSPath: nt.NewNS(t).Path()})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const ns, sa = "linkerd-cni", "linkerd-cni"
	// Linkerd's ClusterRole with the repair controller enabled.
	token, err := c.ServiceAccountToken(ctx, ns, sa, sa, []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods", "nodes", "namespaces", "services"}, Verbs: []string{"list", "get", "watch"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"delete"}},
		{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := c.WriteKubeconfig(kubeconfig, token); err != nil {
		t.Fatal(err)
	}

	bin := buildAs(t, "linkerd-cni-repair-controller")
	cmd := exec.Command(bin, "--admin-addr", "0.0.0.0:9990", "--log-format", "plain", "--log-level", "linkerd_cni_repair_controller=info,warn")
	cmd.Env = append(os.Environ(), "KUBECONFIG="+kubeconfig,
		repair.EnvNodeName+"=node-a", repair.EnvPodName+"=linkerd-cni-x7k2p")
	logFile, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	readLog := func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := netnsutil.Do(c.NetNSPath, cmd.Start); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("repair controller log:\n%s", readLog())
		}
	})

	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (conn net.Conn, err error) {
			err = netnsutil.Do(c.NetNSPath, func() error {
				conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
				return err
			})
			return conn, err
		},
	}}
	get := func(path string) int {
		resp, err := client.Get("http://127.0.0.1:9990" + path)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	deadline := time.Now().Add(time.Minute)
	for get("/ready") != http.StatusOK {
		select {
		case err := <-exited:
			t.Fatalf("the repair controller exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("/ready never answered 200")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if code := get("/live"); code != http.StatusOK {
		t.Errorf("/live = %d, want 200", code)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("after SIGTERM: %v, want exit 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no exit after SIGTERM")
	}
	if want := "logging at info, the most verbose of them"; !strings.Contains(readLog(), want) {
		t.Errorf("log lacks %q:\n%s", want, readLog())
	}
}
