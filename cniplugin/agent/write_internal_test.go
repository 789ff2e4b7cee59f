package agent

import (
	"os"
	"strings"
	"testing"
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
