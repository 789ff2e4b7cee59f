package images

// The images' file systems unpacked as a runtime would, and their programs run from them (chroot)
// as the images' user, inside throwaway network namespaces: what the layer's capabilities, links
// and Debian libraries are worth is shown by what runs.

import (
	"bytes"
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// unpackImage unpacks the image's archive into a fresh directory.
func unpackImage(t *testing.T, name string) string {
	t.Helper()
	_, outDir := buildAll(t)
	a := readArchive(t, filepath.Join(outDir, name+".tar"))
	root := filepath.Join(t.TempDir(), "rootfs")
	if err := Unpack(root, a.platform(t, runtime.GOARCH).raw); err != nil {
		t.Fatal(err)
	}
	return root
}

// runIn runs path (inside root) with args, chrooted into root as uid:gid, in the namespace n
// (nil: the test's own), and returns its exit code and output.
func runIn(t *testing.T, n *nt.NS, root string, uid uint32, path string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Dir = "/"
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cmd.SysProcAttr = &syscall.SysProcAttr{Chroot: root, Credential: &syscall.Credential{Uid: uid, Gid: uid}}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	var err error
	if n == nil {
		err = cmd.Run()
	} else if nerr := n.Do(func() error { err = cmd.Run(); return nil }); nerr != nil {
		t.Fatal(nerr)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String()
	}
	t.Fatalf("run %s in %s: %v\n%s", path, root, err, out.String())
	return 0, ""
}

// Linkerd's proxy-init arguments, without the mode flags.
var linkerdArgs = []string{
	"--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102",
	"--inbound-ports-to-ignore", "4190,4191,4567,4568", "--outbound-ports-to-ignore", "4567,4568",
}

// TestProxyInitImageRuns runs Linkerd's proxy-init command line from the proxy-init images, as
// nobody, through Linkerd's path: only the file capabilities of the layer make that work, for
// proxy-init and, in the iptables modes, for the xtables binaries it runs from the image.
func TestProxyInitImageRuns(t *testing.T) {
	nt.RequireRoot(t)
	tests := []struct {
		image, name string
		mode        []string
		check       []string // command run on the host in the namespace, whose output must hold our rules
	}{
		{"proxy-init", "legacy (Linkerd's default)", nil, []string{"iptables-legacy-save", "-t", "nat"}},
		{"proxy-init", "nft", []string{"--firewall-bin-path", "iptables-nft", "--firewall-save-bin-path", "iptables-nft-save"}, []string{"iptables-nft-save", "-t", "nat"}},
		{"proxy-init", "plain (the image's iptables)", []string{"--iptables-mode", "plain"}, []string{"iptables-nft-save", "-t", "nat"}},
		{"proxy-init-nftables", "nftables", []string{"--iptables-mode", "nftables"}, []string{"nft", "list", "ruleset"}},
	}
	roots := map[string]string{}
	for _, tc := range tests {
		if roots[tc.image] == "" {
			roots[tc.image] = unpackImage(t, tc.image)
		}
	}
	for _, tc := range tests {
		t.Run(tc.image+"/"+tc.name, func(t *testing.T) {
			root := roots[tc.image]
			n := nt.NewNS(t)
			args := append(append([]string{}, tc.mode...), linkerdArgs...)
			if tc.mode == nil {
				args = append([]string{"--iptables-mode", "legacy"}, args...)
			}
			code, out := runIn(t, n, root, 65534, "/usr/lib/linkerd/linkerd2-proxy-init", args...)
			if code != 0 {
				t.Fatalf("linkerd2-proxy-init as nobody: exit %d\n%s", code, out)
			}
			got, err := nt.RunIn(t, n, tc.check[0], tc.check[1:]...)
			if err != nil {
				t.Fatalf("%s: %v\n%s", tc.check, err, got)
			}
			if !strings.Contains(got, "redirect-all-outgoing-to-proxy-port") && !strings.Contains(got, "4140") {
				t.Errorf("%s after the image's proxy-init:\n%s", tc.check, got)
			}
		})
	}
}

// TestValidatorImageRunsWithoutCapabilities runs the validator copy (TestImages checks that it
// carries no capabilities, so a container dropping them all can execute it) as nobody, from the
// image, under Linkerd's path.
func TestValidatorImageRunsWithoutCapabilities(t *testing.T) {
	nt.RequireRoot(t)
	for _, image := range []string{"proxy-init", "proxy-init-nftables"} {
		t.Run(image, func(t *testing.T) {
			root := unpackImage(t, image)
			code, out := runIn(t, nil, root, 65534, "/usr/lib/linkerd/linkerd2-network-validator", "--help")
			if code != 0 || !strings.Contains(out, "proxy-init validate proves") {
				t.Fatalf("linkerd2-network-validator --help: exit %d\n%s", code, out)
			}
		})
	}
}

// TestLinkerdCNIImageNames runs the linkerd-cni image's programs under Linkerd's paths, and the
// two the installer copies onto the node.
func TestLinkerdCNIImageNames(t *testing.T) {
	nt.RequireRoot(t)
	root := unpackImage(t, "linkerd-cni")
	for _, tc := range []struct {
		path string
		uid  uint32
		args []string
		want string
	}{
		{"/usr/lib/linkerd/linkerd-cni-repair-controller", 65534, []string{"--help"}, "linkerd-cni repair deletes the pods"},
		{"/usr/bin/linkerd2-cni-install", 0, []string{"--help"}, "Usage of linkerd-cni install"},
		{"/opt/cni/bin/linkerd-cni", 0, []string{"version"}, "linkerd-cni "},
	} {
		code, out := runIn(t, nil, root, tc.uid, tc.path, tc.args...)
		if code != 0 || !strings.Contains(out, tc.want) {
			t.Errorf("%s %q: exit %d, want 0 and %q\n%s", tc.path, tc.args, code, tc.want, out)
		}
	}
}
