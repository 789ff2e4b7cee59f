package agent

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
	"github.com/kubemesh/proxy-init/iptables"
)

// TestCheckWriteNetNSOwn: the agent's real network namespace (this process's, at the default
// reference) is refused before anything could write there; the check itself writes nothing.
func TestCheckWriteNetNSOwn(t *testing.T) {
	f, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	refuse, decline := checkWriteNetNS(f, "/var/run/netns/cni-1", nsRefs{own: "/proc/self/ns/net", host: "/proc/1/ns/net", pinned: "/var/run/netns"})
	if refuse == nil || decline != nil || !strings.Contains(refuse.Message, "the agent's own network namespace") {
		t.Errorf("refuse %v, decline %v; want the agent's own namespace refused", refuse, decline)
	}
}

// TestCapDecline: an agent without NET_ADMIN or SYS_ADMIN declines with a capability error that
// stays one for the plugin (errors.As finds the *iptables.CapabilityError, naming both
// capabilities), with the message the docs show; one with both writes.
func TestCapDecline(t *testing.T) {
	both := uint64(1<<unix.CAP_NET_ADMIN | 1<<unix.CAP_SYS_ADMIN)
	if d := capDecline(both); d != nil {
		t.Errorf("CapEff %016x: declined %v", both, d)
	}
	for _, capEff := range []uint64{0, 1 << unix.CAP_NET_ADMIN, 1 << unix.CAP_SYS_ADMIN} {
		d := capDecline(capEff)
		want := fmt.Sprintf("the agent does not hold NET_ADMIN and SYS_ADMIN (CapEff %016x; the chart grants them with audits)", capEff)
		var ce *iptables.CapabilityError
		if d == nil || d.Code != wire.CodeCapability || d.Message != want || !errors.As(d, &ce) {
			t.Fatalf("CapEff %016x: declined %#v, want a capability error: %s", capEff, d, want)
		}
		if !slices.Equal(ce.Caps, []string{"CAP_NET_ADMIN", "CAP_SYS_ADMIN"}) || !strings.HasPrefix(ce.NetNS, "net:[") {
			t.Errorf("CapEff %016x: %+v", capEff, ce)
		}
	}
}
