package logging

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestParseFilter(t *testing.T) {
	const us = "linkerd_cni_repair_controller"
	tests := []struct {
		name, in string
		want     slog.Level
		note     string // substring of the note; "" means no note
		err      string // the exact error; "" means none
	}{
		{name: "plain level", in: "info", want: slog.LevelInfo},
		{name: "plain logrus name", in: "warning", want: slog.LevelWarn},
		{name: "plain off", in: "off", want: LevelOff},
		{name: "Linkerd's default", in: us + "=info,warn", want: slog.LevelInfo,
			note: "log filter: the directives for linkerd_cni_repair_controller are linkerd_cni_repair_controller=info,warn; logging at info"},
		{name: "default more verbose than ours", in: us + "=warn,debug", want: slog.LevelDebug, note: "logging at debug"},
		{name: "target prefix applies", in: "linkerd=trace,error", want: LevelTrace, note: "linkerd=trace,error; logging at trace"},
		{name: "other targets ignored", in: "kube=trace,hyper=debug,warn", want: slog.LevelWarn, note: "are warn; logging at warn"},
		{name: "only other targets", in: "kube=trace", want: slog.LevelError, note: "no directive of the log filter applies to linkerd_cni_repair_controller; logging errors only"},
		{name: "empty directives skipped", in: ",info,", want: slog.LevelInfo, note: "logging at info"},
		{name: "module path target", in: us + "::controller=debug", want: slog.LevelError, note: "no directive"},
		{name: "unknown level", in: "loud", want: slog.LevelInfo,
			err: `unknown log level "loud"; want trace, debug, info, warn, error or off`},
		{name: "unknown level in a directive", in: us + "=loud,warn", want: slog.LevelInfo,
			err: `directive "linkerd_cni_repair_controller=loud": unknown log level "loud"; want trace, debug, info, warn, error or off`},
		{name: "span filter", in: us + "[reconcile]=debug", want: slog.LevelInfo,
			err: "span and field filters are not supported; want levels and target=level directives separated by commas, such as linkerd_cni_repair_controller=info,warn"},
		{name: "field filter", in: "info,{pod=x}=debug", want: slog.LevelInfo,
			err: "span and field filters are not supported; want levels and target=level directives separated by commas, such as linkerd_cni_repair_controller=info,warn"},
		{name: "bad target", in: "a b=info", want: slog.LevelInfo,
			err: `directive "a b=info": bad target "a b"; want a module path such as linkerd_cni_repair_controller`},
		{name: "empty target", in: "=info", want: slog.LevelInfo,
			err: `directive "=info": bad target ""; want a module path such as linkerd_cni_repair_controller`},
		{name: "empty", in: "", want: slog.LevelInfo,
			err: `unknown log level ""; want trace, debug, info, warn, error or off`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f, err := ParseFilter(tc.in, us)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if gotErr != tc.err {
				t.Fatalf("ParseFilter(%q) error %q, want %q", tc.in, gotErr, tc.err)
			}
			if f.Level != tc.want {
				t.Errorf("ParseFilter(%q) level %v, want %v", tc.in, f.Level, tc.want)
			}
			if (tc.note == "") != (f.Note == "") || !strings.Contains(f.Note, tc.note) {
				t.Errorf("ParseFilter(%q) note %q, want one containing %q", tc.in, f.Note, tc.note)
			}
		})
	}
}

// The note shows at the chosen level, even when that is warn or error.
func TestFilterLog(t *testing.T) {
	f, err := ParseFilter("kube=debug,x=info", "linkerd_network_validator")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	f.Log(New(&buf, "plain", f.Level))
	if !strings.Contains(buf.String(), `level=ERROR msg="no directive of the log filter applies to linkerd_network_validator; logging errors only"`) {
		t.Fatalf("log = %q", buf.String())
	}
}
