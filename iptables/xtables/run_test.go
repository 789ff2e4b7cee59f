package xtables

import (
	"errors"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRunStreams runs a real process through both ways of feeding it: memory files, and pipes
// where memfd_create is refused. Input, output, standard error and the exit status must come
// through the same either way.
func TestRunStreams(t *testing.T) {
	script := `cat; echo oops >&2; exit 3`
	for _, tt := range []struct {
		name  string
		memfd func(string, int) (int, error)
	}{
		{"memory files", unix.MemfdCreate},
		{"pipes", func(string, int) (int, error) { return -1, unix.EPERM }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			orig := memfdCreate
			memfdCreate = tt.memfd
			t.Cleanup(func() { memfdCreate = orig })

			out, stderr, err := run(exec.Command("sh", "-c", script), "payload line\n", false)
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 3 {
				t.Fatalf("err = %v, want exit status 3", err)
			}
			if string(out) != "payload line\n" || string(stderr) != "oops\n" {
				t.Errorf("stdout %q, stderr %q; want the input back and oops", out, stderr)
			}
			out, _, _ = run(exec.Command("sh", "-c", script), "payload line\n", true)
			if string(out) != "payload line\noops\n" {
				t.Errorf("combined output %q, want both streams in order", out)
			}
		})
	}
}
