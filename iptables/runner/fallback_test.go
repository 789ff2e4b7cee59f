package runner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
)

// fake is an applier whose answers are set by the test; it records what it was asked.
type fake struct {
	name  string
	err   error
	rules []string
	calls *[]string
}

func (f *fake) Name() string { return f.name }

func (f *fake) Covers() []iptables.Backend { return []iptables.Backend{iptables.Backend(f.name)} }

func (f *fake) Present(context.Context) ([]iptables.Elsewhere, error) {
	*f.calls = append(*f.calls, "present "+f.name)
	return nil, f.err
}

func (f *fake) Apply(context.Context, *iptables.Ruleset) (iptables.Result, error) {
	*f.calls = append(*f.calls, "apply "+f.name)
	return iptables.Result{Changed: f.err == nil}, f.err
}

func (f *fake) Show(context.Context, *iptables.Ruleset) (iptables.State, error) {
	*f.calls = append(*f.calls, "show "+f.name)
	return iptables.State{Backend: f.name, Families: []iptables.FamilyState{{Family: iptables.IPv4, Rules: f.rules}}}, f.err
}

func (f *fake) Cleanup(context.Context) error {
	*f.calls = append(*f.calls, "cleanup "+f.name)
	return f.err
}

var (
	errUnsupported = fmt.Errorf("write: %w: no such file or directory", iptables.ErrUnsupported)
	denied         = &iptables.CapabilityError{Caps: []string{"CAP_NET_ADMIN"}, NetNS: "net:[1]", Op: "write", Err: errors.New("operation not permitted")}
	errNotFound    = errors.New("iptables-legacy-restore not found in PATH")
)

func fallback(calls *[]string, backends ...*fake) *Fallback {
	f := &Fallback{}
	for _, b := range backends {
		b.calls = calls
		if b.err == errNotFound {
			f.tries = append(f.tries, try{b.name, func() (iptables.Applier, error) { return nil, errNotFound }})
			continue
		}
		f.tries = append(f.tries, try{b.name, func() (iptables.Applier, error) { return b, nil }})
	}
	return f
}

func TestFallbackApply(t *testing.T) {
	for _, c := range []struct {
		name     string
		backends []*fake
		calls    string
		chosen   string
		note     string // empty: none
		err      string // empty: success
	}{
		{"the first writes", []*fake{{name: "a"}, {name: "b"}}, "apply a", "a", "", ""},
		{"an unsupported kernel passes over", []*fake{{name: "a", err: errUnsupported}, {name: "b"}}, "apply a, apply b", "b",
			"b wrote the rules; passed over a: write: the kernel does not support this backend: no such file or directory", ""},
		{"missing binaries pass over", []*fake{{name: "a", err: errNotFound}, {name: "b"}}, "apply b", "b",
			"b wrote the rules; passed over a: iptables-legacy-restore not found in PATH", ""},
		{"a missing capability stops", []*fake{{name: "a", err: denied}, {name: "b"}}, "apply a", "a", "",
			"write: permission denied: this needs CAP_NET_ADMIN in network namespace net:[1] (grant the container NET_ADMIN): operation not permitted"},
		{"any other failure stops", []*fake{{name: "a", err: errUnsupported}, {name: "b", err: errors.New("busy")}, {name: "c"}}, "apply a, apply b", "a", "",
			"busy (after passing over a: write: the kernel does not support this backend: no such file or directory)"},
		{"none works", []*fake{{name: "a", err: errUnsupported}, {name: "b", err: errNotFound}}, "apply a", "a", "",
			"no backend works here: a: write: the kernel does not support this backend: no such file or directory; b: iptables-legacy-restore not found in PATH"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var calls []string
			f := fallback(&calls, c.backends...)
			res, err := f.Apply(context.Background(), nil)
			if got := strings.Join(calls, ", "); got != c.calls {
				t.Errorf("calls %q, want %q", got, c.calls)
			}
			if c.err == "" {
				if err != nil || res.Note != c.note || f.Name() != c.chosen || f.Covers()[0] != iptables.Backend(c.chosen) {
					t.Errorf("apply: %v, note %q, name %q; want success, note %q, name %q", err, res.Note, f.Name(), c.note, c.chosen)
				}
				return
			}
			if err == nil || err.Error() != c.err {
				t.Errorf("apply error:\n %v\nwant:\n %s", err, c.err)
			}
			if f.chosen != nil || f.Covers() != nil {
				t.Errorf("a failed apply chose %s", f.chosen.Name())
			}
		})
	}
}

// Show reads with the backend that holds our rules, else the first that can read.
func TestFallbackShow(t *testing.T) {
	var calls []string
	f := fallback(&calls, &fake{name: "a"}, &fake{name: "b", err: errUnsupported}, &fake{name: "c", rules: []string{"-A X"}})
	st, err := f.Show(context.Background(), nil)
	if err != nil || st.Backend != "c" || f.Name() != "c" {
		t.Errorf("show: %+v, %v; want c's rules", st, err)
	}
	calls = nil
	f = fallback(&calls, &fake{name: "a"}, &fake{name: "b"})
	if st, err := f.Show(context.Background(), nil); err != nil || st.Backend != "a" || strings.Join(calls, ", ") != "show a, show b" {
		t.Errorf("show with no rules anywhere: %+v, %v after %q; want a's empty state after asking both", st, err, calls)
	}
	f = fallback(&calls, &fake{name: "a", err: denied}, &fake{name: "b", rules: []string{"-A X"}})
	if _, err := f.Show(context.Background(), nil); !iptables.IsCapabilityError(err) {
		t.Errorf("show without the capability: %v; want the CapabilityError, not b's rules", err)
	}
}

func TestFallbackCleanup(t *testing.T) {
	var calls []string
	f := fallback(&calls, &fake{name: "a", err: errUnsupported}, &fake{name: "b"}, &fake{name: "c"})
	if err := f.Cleanup(context.Background()); err != nil || strings.Join(calls, ", ") != "cleanup a, cleanup b" {
		t.Errorf("cleanup: %v after %q", err, calls)
	}
}
