package xtables

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

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

			sh, err := exec.LookPath("sh")
			if err != nil {
				t.Fatal(err)
			}
			out, stderr, err := run(context.Background(), sh, []string{"-c", script}, "payload line\n", false)
			var ee interface{ ExitCode() int }
			if !errors.As(err, &ee) || ee.ExitCode() != 3 || err.Error() != "exit status 3" {
				t.Fatalf("err = %v, want exit status 3", err)
			}
			if string(out) != "payload line\n" || string(stderr) != "oops\n" {
				t.Errorf("stdout %q, stderr %q; want the input back and oops", out, stderr)
			}
			out, _, _ = run(context.Background(), sh, []string{"-c", script}, "payload line\n", true)
			if string(out) != "payload line\noops\n" {
				t.Errorf("combined output %q, want both streams in order", out)
			}
		})
	}
}

// A program still running when the context ends is killed, and the error says why.
func TestRunKilledWhenTheContextEnds(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, _, err = run(ctx, sleep, []string{"10"}, "", false)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "signal: killed") {
		t.Errorf("err = %v, want the deadline and the kill", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("run returned after %s: the program was not killed", d)
	}
}
