package nftables

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and writes nftables rules in them (run as root; CI does)")
	}
}

// newNS creates a throwaway network namespace, removed when the test ends.
func newNS(t testing.TB) ns.NetNS {
	t.Helper()
	requireRoot(t)
	n, err := testutils.NewNS()
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		_ = n.Close()
		_ = testutils.UnmountNS(n)
	})
	return n
}

// in runs fn inside n on a locked thread.
func in(t testing.TB, n ns.NetNS, fn func() error) {
	t.Helper()
	if err := n.Do(func(ns.NetNS) error { return fn() }); err != nil {
		t.Fatal(err)
	}
}

// run runs a command inside n and returns its output; the child inherits the locked thread's
// namespace.
func run(t testing.TB, n ns.NetNS, stdin string, name string, args ...string) (string, error) {
	t.Helper()
	var out []byte
	var err error
	_ = n.Do(func(ns.NetNS) error {
		cmd := exec.Command(name, args...)
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		out, err = cmd.CombinedOutput()
		return nil
	})
	return string(out), err
}

func mustRun(t testing.TB, n ns.NetNS, stdin string, name string, args ...string) string {
	t.Helper()
	out, err := run(t, n, stdin, name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func build(t testing.TB, mod func(*iptables.Config)) *iptables.Ruleset {
	t.Helper()
	c := iptables.NewConfig()
	c.InboundProxyPort, c.OutboundProxyPort, c.ProxyUID = 4143, 4140, 2102
	c.InboundPortsToIgnore = []string{"4190,4191,4567,4568"}
	c.OutboundPortsToIgnore = []string{"4567,4568"}
	if mod != nil {
		mod(&c)
	}
	rs, err := iptables.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func ctx(t testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// generation reads the nftables ruleset generation, which every committed transaction bumps.
func generation(t testing.TB, n ns.NetNS) uint32 {
	t.Helper()
	var gen uint32
	in(t, n, func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		msgs, err := c.Execute(netlink.Message{
			Header: netlink.Header{Type: netlink.HeaderType(unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_GETGEN), Flags: netlink.Request},
			Data:   nfgen(unix.AF_UNSPEC, 0),
		})
		if err != nil {
			return fmt.Errorf("getgen: %w", err)
		}
		ad, err := netlink.NewAttributeDecoder(msgs[0].Data[4:])
		if err != nil {
			return err
		}
		ad.ByteOrder = binary.BigEndian
		for ad.Next() {
			if ad.Type() == unix.NFTA_GEN_ID {
				gen = ad.Uint32()
			}
		}
		return ad.Err()
	})
	return gen
}

// ourTable returns our table's listing entry in n, or nil.
func ourTable(t testing.TB, n ns.NetNS) *tableInfo {
	t.Helper()
	var ti *tableInfo
	in(t, n, func() error {
		c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
		if err != nil {
			return err
		}
		defer c.Close()
		ts, err := listTables(c)
		if err != nil {
			return err
		}
		ti = findTable(ts, inet, iptables.NFTTableName)
		return nil
	})
	return ti
}

func apply(t testing.TB, n ns.NetNS, a *Applier, rs *iptables.Ruleset) iptables.Result {
	t.Helper()
	var res iptables.Result
	in(t, n, func() error {
		var err error
		res, err = a.Apply(ctx(t), rs)
		return err
	})
	return res
}

func show(t testing.TB, n ns.NetNS, rs *iptables.Ruleset) iptables.State {
	t.Helper()
	var st iptables.State
	in(t, n, func() error {
		var err error
		st, err = New().Show(ctx(t), rs)
		return err
	})
	return st
}

// listing is `nft list table` with the handles and the set element layout normalized away.
func listing(t testing.TB, n ns.NetNS) string {
	t.Helper()
	return mustRun(t, n, "", "nft", "list", "table", "inet", iptables.NFTTableName)
}

func TestApplyShowReapplyCleanup(t *testing.T) {
	n := newNS(t)
	rs := build(t, func(c *iptables.Config) {
		c.InboundSubnetsToIgnore = []string{"198.51.100.0/24,2001:db8:1::/48"}
		c.OutboundSubnetsToIgnore = []string{"192.0.2.0/25,203.0.113.0/30,203.0.113.4", "2001:db8:2::/64,2001:db8:3::1"}
	})
	a := New()
	if res := apply(t, n, a, rs); !res.Changed {
		t.Fatal("first apply reported no change")
	}
	got := listing(t, n)
	for _, want := range []string{
		`comment "` + rs.NFTComment() + `"`,
		"type nat hook prerouting priority dstnat; policy accept;",
		"type nat hook output priority -100; policy accept;",
		`meta skuid 2102 return comment "proxy-init/ignore-proxy-user-id"`,
		`oifname "lo" return comment "proxy-init/ignore-loopback"`,
		"ip6 daddr @outbound_ignore_subnets_v6 return",
		`meta l4proto tcp redirect to :4140 comment "proxy-init/redirect-all-outgoing-to-proxy-port"`,
		"elements = { 4190-4191, 4567-4568 }",
		"2001:db8:3::1 }",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("nft list lacks %q:\n%s", want, got)
		}
	}
	if st := show(t, n, rs); !st.Match() {
		t.Errorf("show after apply does not match:\n%s", st.Families[0].Diff)
	}

	// Re-apply: nothing written, proven by the ruleset generation and the table handle.
	gen, handle := generation(t, n), ourTable(t, n).Handle
	if res := apply(t, n, a, rs); res.Changed {
		t.Error("re-apply with the same plan reported a change")
	}
	if g := generation(t, n); g != gen {
		t.Errorf("re-apply committed a transaction: generation %d -> %d", gen, g)
	}
	if h := ourTable(t, n).Handle; h != handle {
		t.Errorf("re-apply replaced the table: handle %d -> %d", handle, h)
	}

	// Cleanup leaves nothing, and is idempotent.
	in(t, n, func() error { return a.Cleanup(ctx(t)) })
	if out := mustRun(t, n, "", "nft", "list", "ruleset"); strings.TrimSpace(out) != "" {
		t.Errorf("ruleset after cleanup:\n%s", out)
	}
	gen = generation(t, n)
	in(t, n, func() error { return a.Cleanup(ctx(t)) })
	if g := generation(t, n); g != gen {
		t.Errorf("second cleanup wrote: generation %d -> %d", gen, g)
	}
	if st := show(t, n, rs); st.Match() || len(st.Families[0].Diff.Missing) == 0 {
		t.Errorf("show after cleanup should report everything missing: %+v", st)
	}
}

var _ = bytes.Equal
var _ = errors.Is
