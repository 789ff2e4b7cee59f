package proxyinit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	"github.com/kubemesh/proxy-init/test/runnertest"
)

// proxy-init's exit codes and messages for apply, show and cleanup, through the real backend
// path with a fake applier: no root, no namespace, no kernel.
func TestPolicyWithAFakeApplier(t *testing.T) {
	fake := iptablestest.NewFake()
	closeWait := filepath.Join(t.TempDir(), "close_wait")
	if err := os.WriteFile(closeWait, []byte("60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := runnertest.Runner(fake, closeWait)
	main := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), args, &stdout, &stderr, r)
		return code, stdout.String(), stderr.String()
	}

	args := chartArgs("--timeout-close-wait-secs", "120")
	if code, _, stderr := main(args...); code != ExitOK || !strings.Contains(stderr, `msg="rules applied" backend=fake changed=true close_wait_secs=120`) {
		t.Fatalf("apply: exit %d\n%s", code, stderr)
	}
	if b, _ := os.ReadFile(closeWait); string(b) != "120" {
		t.Errorf("close-wait file %q, want 120", b)
	}
	if code, stdout, stderr := main(append([]string{"show"}, args...)...); code != ExitOK || !strings.Contains(stdout, "rules match the configuration") {
		t.Errorf("show after apply: exit %d\n%s%s", code, stdout, stderr)
	}

	// Someone deletes IPv6's rules: show names the state and exits 1. The fake, like the netlink
	// writers, writes both families at once, so it is not called half-applied.
	fake.Set(iptables.IPv6, nil)
	code, stdout, _ := main(append([]string{"show"}, args...)...)
	if code != ExitFailure || !strings.Contains(stdout, "ipv4 has every rule but ipv6 has none: no run was cut short (fake writes both families in one transaction)") ||
		strings.Contains(stdout, "half-applied") || !strings.Contains(stdout, "rules do NOT match") {
		t.Errorf("show of a half-applied state: exit %d\n%s", code, stdout)
	}
	// A re-apply completes it; a changed close-wait shows as a mismatch.
	if code, _, stderr := main(args...); code != ExitOK || !strings.Contains(stderr, "changed=true") {
		t.Errorf("re-apply: exit %d\n%s", code, stderr)
	}
	if err := os.WriteFile(closeWait, []byte("60\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, stdout, _ := main(append([]string{"show"}, args...)...); code != ExitFailure || !strings.Contains(stdout, closeWait+": 60, want 120: DO NOT MATCH") {
		t.Errorf("show with the close-wait changed: exit %d\n%s", code, stdout)
	}

	// A failing backend: exit 1, the error logged with the backend's name, nothing printed.
	fake.Fail("apply", errors.New("kernel says no"))
	if code, stdout, stderr := main(args...); code != ExitFailure || stdout != "" || !strings.Contains(stderr, "apply rules with fake: kernel says no") {
		t.Errorf("a failing apply: exit %d\n%s%s", code, stdout, stderr)
	}

	if code, _, stderr := main("cleanup"); code != ExitOK || fake.Dump() != "# ipv4\n# ipv6\n" {
		t.Errorf("cleanup: exit %d, left:\n%s%s", code, fake.Dump(), stderr)
	}
	// Bad input reaches no backend at all.
	before := fake.Calls("apply")
	if code, _, _ := main(chartArgs("--proxy-uid", "4294967296")...); code != ExitUsage || fake.Calls("apply") != before {
		t.Errorf("bad input: exit %d, applies %d -> %d", code, before, fake.Calls("apply"))
	}
}
