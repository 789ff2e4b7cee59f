package cniplugin

import (
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
)

// The W3C example traceparent, and its trace ID.
const (
	testTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	testTraceID     = "4bf92f3577b34da6a3ce929d0e0e4736"
)

func TestParseTraceParent(t *testing.T) {
	for _, tc := range []struct {
		in, id, err string
	}{
		{testTraceParent, testTraceID, ""},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", testTraceID, ""},
		// A later version may add fields after the flags.
		{"cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-brings", testTraceID, ""},
		{"", "", "not version-traceid-parentid-flags (2, 32, 16 and 2 hex digits)"},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", "", "not version-traceid-parentid-flags (2, 32, 16 and 2 hex digits)"},
		{"00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01", "", "not version-traceid-parentid-flags (2, 32, 16 and 2 hex digits)"},
		{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "", "version ff is not one"},
		{"0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "", "version 0g is not one"},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", "", "version 00 with more than four fields"},
		{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x", "", "version 01 with more than four fields"},
		{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", "", "trace ID 4BF92F3577B34DA6A3CE929D0E0E4736 is not 32 lower-case hex digits, not all zero"},
		{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", "", "trace ID 00000000000000000000000000000000 is not 32 lower-case hex digits, not all zero"},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", "", "parent ID 0000000000000000 is not 16 lower-case hex digits, not all zero"},
		{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0z", "", "flags 0z are not 2 lower-case hex digits"},
	} {
		id, err := parseTraceParent(tc.in)
		if msg := errString(err); id != tc.id || msg != tc.err {
			t.Errorf("parseTraceParent(%q) = %q, %q; want %q, %q", tc.in, id, msg, tc.id, tc.err)
		}
	}
}

// unsetTrace takes TRACEPARENT out of the environment for the test, whatever ran it.
func unsetTrace(t *testing.T) {
	t.Setenv(EnvTraceParent, "") // restored at the end
	if err := os.Unsetenv(EnvTraceParent); err != nil {
		t.Fatal(err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// stamp matches what differs between two runs of the same call: the time of each line, and
// the durations.
var stamp = regexp.MustCompile(`time=\S+ |=[0-9.]+(ns|µs|ms|s)\b`)

// TestTraceIDOnEveryLine: with TRACEPARENT set, every line of ADD, CHECK and DEL carries its
// trace ID, and nothing else changes: without it, the lines are those of the traced calls with
// the attribute taken out. A malformed one is ignored, saying so at debug; TRACESTATE and
// BAGGAGE are never logged.
func TestTraceIDOnEveryLine(t *testing.T) {
	run := func(t *testing.T, level string) string {
		r := newPolicyRig(t, meshedPod(nil, nil))
		args := r.args(t)
		args.StdinData = []byte(strings.Replace(string(args.StdinData), `"log_level":"info"`, `"log_level":"`+level+`"`, 1))
		for _, cmd := range []func() error{func() error { return r.plugin.Add(args) }, func() error { return r.plugin.Check(args) }, func() error { return r.plugin.Del(args) }} {
			if err := cmd(); err != nil {
				t.Fatal(err)
			}
		}
		return stamp.ReplaceAllString(r.logs.String(), "")
	}
	unsetTrace(t)
	plain := run(t, "debug")
	if strings.Contains(plain, "trace") {
		t.Fatalf("without TRACEPARENT, the lines name a trace:\n%s", plain)
	}

	t.Setenv(EnvTraceParent, testTraceParent)
	t.Setenv("TRACESTATE", "congo=t61rcWkgMzE")
	t.Setenv("BAGGAGE", "userId=alice")
	traced := run(t, "debug")
	lines := strings.Split(strings.TrimSuffix(traced, "\n"), "\n")
	for _, want := range []string{"cmd=ADD", "cmd=CHECK", "cmd=DEL"} {
		if !strings.Contains(traced, want) {
			t.Errorf("no %s line:\n%s", want, traced)
		}
	}
	for _, l := range lines {
		if !strings.Contains(l, " trace_id="+testTraceID) {
			t.Errorf("a line without the trace ID: %s", l)
		}
	}
	if strings.Contains(traced, "t61rcWkgMzE") || strings.Contains(traced, "alice") {
		t.Errorf("TRACESTATE or BAGGAGE logged:\n%s", traced)
	}
	if without := strings.ReplaceAll(traced, " trace_id="+testTraceID, ""); without != plain {
		t.Errorf("the traced lines differ by more than the trace ID:\n%s\nuntraced:\n%s", without, plain)
	}

	t.Setenv(EnvTraceParent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7")
	bad := run(t, "debug")
	want := `level=DEBUG msg="ignoring TRACEPARENT: not a W3C traceparent" cmd=ADD pod=api-0 namespace=web container_id=c1 traceparent=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7 error="not version-traceid-parentid-flags (2, 32, 16 and 2 hex digits)"`
	if !strings.Contains(bad, want+"\n") || strings.Contains(bad, "trace_id=") {
		t.Errorf("with a malformed TRACEPARENT, want %s and no trace ID:\n%s", want, bad)
	}
	if info := run(t, "info"); strings.Contains(info, "trace") {
		t.Errorf("at info, a malformed TRACEPARENT shows:\n%s", info)
	}
}

// TestTraceIDInTheReport: the report to the node agent carries the trace ID; without
// TRACEPARENT it has none, and its JSON has no such key.
func TestTraceIDInTheReport(t *testing.T) {
	for _, want := range []string{testTraceID, ""} {
		t.Run("trace "+want, func(t *testing.T) {
			a := startFakeAgent(t, answer(t, meshedPod(nil, nil), &Namespace{ObjectMeta: ObjectMeta{Name: "web"}}))
			r := nodeRig(t, nil)
			unsetTrace(t)
			if want != "" {
				t.Setenv(EnvTraceParent, testTraceParent)
			}
			if err := r.plugin.Add(agentArgs(t, r, a.socket, "2s")); err != nil {
				t.Fatal(err)
			}
			select {
			case rep := <-a.reports:
				if rep.TraceID != want || !strings.Contains(rep.Log, `msg="rules written"`) || strings.Contains(rep.Log, "trace_id=") != (want != "") {
					t.Errorf("report %+v, want trace ID %q on it and its lines", rep, want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no report")
			}
		})
	}
	if b := mustJSONBytes(t, wire.Report{V: wire.Version, Command: "ADD", Result: "ok", Lookup: "agent"}); strings.Contains(string(b), "trace") {
		t.Errorf("an untraced report's JSON: %s", b)
	}
}
