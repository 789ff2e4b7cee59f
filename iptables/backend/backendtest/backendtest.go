// Package backendtest gives tests of the Runner's callers (the CNI plugin's and proxy-init's
// policies) a Runner that takes the whole path without root. Only tests import it; the
// dead-code check in `make test` lists it as such.
package backendtest

import (
	"log/slog"
	"time"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/backend"
)

// Runner returns a backend.Runner that takes the whole path with a, which is usually an
// *iptablestest.Fake: it enters no namespace, takes no lock, has no other backend to clear, and
// reads and writes the close-wait timeout in closeWaitFile.
func Runner(a iptables.Applier, closeWaitFile string) backend.Runner {
	return backend.Runner{
		Choose:        func(backend.Options) (iptables.Applier, string, error) { return a, "a test asks for it", nil },
		Others:        func([]iptables.Backend) []iptables.Applier { return nil },
		Enter:         func(_ string, _ bool, _ time.Duration, _ *slog.Logger, fn func() error) error { return fn() },
		CloseWaitFile: closeWaitFile,
	}
}
