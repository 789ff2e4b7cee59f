package netnsutil_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// ForeignUserNS finds the pods with a user namespace of their own, and only them, and names each
// one's owner as the kernel does.
func TestForeignUserNS(t *testing.T) {
	plain := netnstest.NewNS(t)
	pod, other := netnstest.NewUserNS(t), netnstest.NewUserNS(t)
	ours, err := os.Readlink("/proc/self/ns/user")
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{}
	for _, c := range []struct {
		path    string
		foreign bool
		err     string
	}{
		{"", false, ""},
		{"/proc/self/ns/net", false, ""},
		{plain.Path(), false, ""},
		{pod.Path(), true, ""},
		{other.Path(), true, ""},
		{"/nonexistent/netns", false, "open the network namespace: open /nonexistent/netns: no such file or directory"},
	} {
		label, err := netnsutil.ForeignUserNS(c.path)
		switch {
		case c.err != "":
			if err == nil || err.Error() != c.err {
				t.Errorf("ForeignUserNS(%q) = %q, %v; want the error %q", c.path, label, err, c.err)
			}
		case err != nil:
			t.Errorf("ForeignUserNS(%q): %v", c.path, err)
		case !c.foreign && label != "":
			t.Errorf("ForeignUserNS(%q) = %q; want \"\": our own user namespace %s owns it", c.path, label, ours)
		case c.foreign && (!regexp.MustCompile(`^user:\[\d+\]$`).MatchString(label) || label == ours):
			t.Errorf("ForeignUserNS(%q) = %q; want a user namespace other than ours, %s", c.path, label, ours)
		}
		labels[c.path] = label
	}
	if labels[pod.Path()] == labels[other.Path()] {
		t.Errorf("two pods' user namespaces have one name, %s", labels[pod.Path()])
	}
	// A process that only entered the pod's network namespace stays in our user namespace.
	if err := pod.Do(func() error {
		label, err := netnsutil.ForeignUserNS("")
		if label != labels[pod.Path()] || err != nil {
			t.Errorf("ForeignUserNS(\"\") inside the pod's network namespace = %q, %v; want %s", label, err, labels[pod.Path()])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// What every operation of the Runner pays to learn that a pod has no user namespace of its own
// (docs/performance.md).
func BenchmarkForeignUserNS(b *testing.B) {
	n := netnstest.NewNS(b)
	for b.Loop() {
		if owner, err := netnsutil.ForeignUserNS(n.Path()); owner != "" || err != nil {
			b.Fatal(owner, err)
		}
	}
}
