package main_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/kubemesh/proxy-init/internal/multicall"
	"github.com/kubemesh/proxy-init/proxyinit"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
	"github.com/kubemesh/proxy-init/validator"
)

// copyAs copies the built binary to a fresh directory under name, as an image holds it.
func copyAs(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return dst
}

// runBin runs bin with args, inside the namespace nsPath when it is set (as a container in the
// pod's namespace runs), and returns its exit code and combined output.
func runBin(t *testing.T, nsPath, bin string, args ...string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out []byte
	var err error
	run := func() error { out, err = cmd.CombinedOutput(); return nil }
	if nsPath == "" {
		_ = run()
	} else if nerr := nt.Existing("pod", nsPath).Do(run); nerr != nil {
		t.Fatal(nerr)
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, string(out)
	case errors.As(err, &ee):
		return ee.ExitCode(), string(out)
	}
	t.Fatalf("run %s %q: %v", bin, args, err)
	return 0, ""
}

// TestLinkerdNames runs a copy of the binary under every name in the multicall table: each
// proxy-init name prints the help of what it stands for, and linkerd-cni's names are refused.
func TestLinkerdNames(t *testing.T) {
	for _, n := range multicall.Names {
		t.Run(n.Name, func(t *testing.T) {
			code, out := runBin(t, "", copyAs(t, n.Name), "--help")
			switch {
			case n.Program != multicall.ProxyInit:
				want := fmt.Sprintf("proxy-init: %s is a name of the linkerd-cni binary, not of proxy-init: install linkerd-cni under it\n", n.Name)
				if code != proxyinit.ExitUsage || out != want {
					t.Errorf("exit %d, output %q; want %d, %q", code, out, proxyinit.ExitUsage, want)
				}
			case n.Subcommand == "validate":
				if code != 0 || out != validator.Usage() {
					t.Errorf("exit %d, output:\n%s\nwant the validator's help", code, out)
				}
			default:
				if code != 0 || out != proxyinit.Usage() {
					t.Errorf("exit %d, output:\n%s\nwant proxy-init's help", code, out)
				}
			}
		})
	}
}

// Linkerd 2.20's control-plane chart, as it renders with its default values: proxy-init in nft
// mode, and the network validator of CNI mode.
var (
	linkerdProxyInit = []string{
		"--firewall-bin-path", "iptables-nft", "--firewall-save-bin-path", "iptables-nft-save", "--ipv6=false",
		"--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102",
		"--inbound-ports-to-ignore", "4190,4191,4567,4568", "--outbound-ports-to-ignore", "4567,4568",
	}
	linkerdValidator = []string{
		"--log-format", "plain", "--log-level", "debug", "--connect-addr", "1.1.1.1:20001",
		"--listen-addr", "0.0.0.0:4140", "--timeout", "10s",
	}
)

// linkerdConnectAddr is the address Linkerd's chart has the validator dial. The test gives it to
// the peer namespace (a test host, never the real one) and routes it there from the pod.
const linkerdConnectAddr = "1.1.1.1"

// TestLinkerdCommandLines runs Linkerd's exact command lines through copies named as in
// Linkerd's proxy image, in the pod namespace: the validator fails with 95 before the rules are
// written and passes after.
func TestLinkerdCommandLines(t *testing.T) {
	nt.RequireRoot(t)
	p := nt.NewPair(t)
	if err := p.Peer.Do(func() error {
		return withLink(func(h *netlink.Handle, eth netlink.Link) error {
			return h.AddrAdd(eth, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP(linkerdConnectAddr), Mask: net.CIDRMask(32, 32)}})
		})
	}); err != nil {
		t.Fatal(err)
	}
	if err := p.Pod.Do(func() error {
		return withLink(func(h *netlink.Handle, eth netlink.Link) error {
			return h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Dst: &net.IPNet{IP: net.ParseIP(linkerdConnectAddr), Mask: net.CIDRMask(32, 32)}, Gw: net.ParseIP(nt.PeerIPv4)})
		})
	}); err != nil {
		t.Fatal(err)
	}
	validatorBin := copyAs(t, "linkerd2-network-validator")

	// The peer answers with a reset: refused, not redirected.
	code, out := runBin(t, p.Pod.Path(), validatorBin, linkerdValidator...)
	if code != validator.ExitRedirectFailed || !strings.Contains(out, "connection refused") {
		t.Fatalf("validator without rules: exit %d, want %d (connection refused)\n%s", code, validator.ExitRedirectFailed, out)
	}

	code, out = runBin(t, p.Pod.Path(), copyAs(t, "linkerd2-proxy-init"), linkerdProxyInit...)
	if code != 0 || !strings.Contains(out, "backend=iptables-nft") {
		t.Fatalf("linkerd2-proxy-init: exit %d, want 0 with the nft backend\n%s", code, out)
	}

	code, out = runBin(t, p.Pod.Path(), validatorBin, linkerdValidator...)
	if code != 0 || !strings.Contains(out, "original_dst="+linkerdConnectAddr+":20001") {
		t.Fatalf("validator with rules: exit %d, want 0, redirected from %s\n%s", code, linkerdConnectAddr, out)
	}
}

// withLink calls f with a netlink handle and the namespace's eth0 (the caller is inside it).
func withLink(f func(*netlink.Handle, netlink.Link) error) error {
	h, err := netlink.NewHandle()
	if err != nil {
		return err
	}
	defer h.Close()
	eth, err := h.LinkByName(nt.IfName)
	if err != nil {
		return err
	}
	return f(h, eth)
}
