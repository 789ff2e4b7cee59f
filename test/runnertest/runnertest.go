// Package runnertest gives tests of the Runner's callers (the CNI plugin's and proxy-init's
// policies) a Runner that takes the whole path without root. Only tests import it; the
// dead-code check in `make test` lists it as such.
package runnertest

import (
	"context"
	"slices"
	"sync"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
)

// Runner returns a runner.Runner that takes the whole path with a, which is usually an
// *iptablestest.Fake: it enters no namespace, takes no lock, has no other backend to clear, finds
// the kernel able to run everything and the namespace with IPv6, keeps the policy routing in a
// Routing of its own, and reads and writes the close-wait timeout in closeWaitFile.
func Runner(a iptables.Applier, closeWaitFile string) runner.Runner {
	return runner.Runner{
		Choose:        func(runner.Options) (iptables.Applier, string, error) { return a, "a test asks for it", nil },
		Others:        func([]iptables.Backend) []iptables.Applier { return nil },
		Enter:         func(_ runner.Target, _ bool, fn func() error) error { return fn() },
		CloseWaitFile: closeWaitFile,
		Kernel:        func(context.Context, iptables.Mode, *iptables.Ruleset) error { return nil },
		Routing:       &Routing{},
		IPv6:          func() (bool, string) { return true, "a test says so" },
	}
}

// Routing is an in-memory runner.Routing: the lines of the policy routing it holds.
type Routing struct {
	mu    sync.Mutex
	lines []string
}

// Read returns the lines held.
func (r *Routing) Read() ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.lines), nil
}

// Ensure adds the lines of want not held, and returns what removes them again.
func (r *Routing) Ensure(want []iptables.PolicyRoute) (func() error, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var added []string
	for _, p := range want {
		for _, l := range p.Lines() {
			if !slices.Contains(r.lines, l) {
				r.lines = append(r.lines, l)
				added = append(added, l)
			}
		}
	}
	return func() error {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.lines = slices.DeleteFunc(r.lines, func(l string) bool { return slices.Contains(added, l) })
		return nil
	}, nil
}

// Prune drops the lines want does not hold.
func (r *Routing) Prune(want []iptables.PolicyRoute) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var keep []string
	for _, p := range want {
		keep = append(keep, p.Lines()...)
	}
	r.lines = slices.DeleteFunc(r.lines, func(l string) bool { return !slices.Contains(keep, l) })
	return nil
}
