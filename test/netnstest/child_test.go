package netnstest

import (
	"errors"
	"os"
	"os/exec"
	"testing"
)

func TestMain(m *testing.M) {
	ChildMain(func() int { return 0 })
	os.Exit(m.Run())
}

// TestChildChecksItsNamespace: a child started in the namespace it was meant for runs; one
// started anywhere else refuses before doing anything.
func TestChildChecksItsNamespace(t *testing.T) {
	RequireRoot(t)
	n := NewNS(t)
	run := func() error {
		cmd := exec.Command(os.Args[0], "-test.run", "^$")
		cmd.Env = append(os.Environ(), ChildEnv(t, n.Path()))
		return cmd.Run()
	}
	if err := n.Do(run); err != nil {
		t.Errorf("child started in its namespace: %v, want exit 0", err)
	}
	var ee *exec.ExitError
	if err := run(); !errors.As(err, &ee) || ee.ExitCode() != ChildRefused {
		t.Errorf("child started outside its namespace: %v, want exit %d", err, ChildRefused)
	}
}
