package logging

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestParseLevel(t *testing.T) {
	tests := []struct {
		in      string
		want    slog.Level
		wantErr bool
	}{
		{in: "trace", want: slog.LevelDebug - 4},
		{in: "debug", want: slog.LevelDebug},
		{in: "info", want: slog.LevelInfo},
		{in: " INFO ", want: slog.LevelInfo},
		{in: "warn", want: slog.LevelWarn},
		{in: "Warning", want: slog.LevelWarn},
		{in: "error", want: slog.LevelError},
		{in: "fatal", want: slog.LevelError},
		{in: "panic", want: slog.LevelError},
		{in: "", want: slog.LevelInfo, wantErr: true},
		{in: "loud", want: slog.LevelInfo, wantErr: true},
		{in: "info+2", want: slog.LevelInfo, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseLevel(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("ParseLevel(%q) = %v, %v; want %v, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
			if err != nil && err.Error() != "unknown log level; want trace, debug, info, warn or error" {
				t.Fatalf("ParseLevel(%q) error %q", tc.in, err)
			}
		})
	}
}

func TestCheckFormat(t *testing.T) {
	tests := []struct {
		in      string
		wantErr bool
	}{
		{"plain", false},
		{"json", false},
		{"", true},
		{"text", true},
		{"JSON", true},
		{"xml", true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			err := CheckFormat(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("CheckFormat(%q) = %v, want error %v", tc.in, err, tc.wantErr)
			}
			if err != nil && err.Error() != "unknown log format; want plain or json" {
				t.Fatalf("CheckFormat(%q) error %q", tc.in, err)
			}
		})
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		format string
		json   bool
	}{
		{"json", true},
		{"plain", false},
		{"", false},
	}
	for _, tc := range tests {
		t.Run(tc.format, func(t *testing.T) {
			var buf bytes.Buffer
			log := New(&buf, tc.format, slog.LevelWarn)
			log.Info("dropped")
			log.Warn("kept", "k", "v")
			out := strings.TrimSpace(buf.String())
			if strings.Contains(out, "dropped") || strings.Count(out, "\n") != 0 {
				t.Fatalf("level warn logged %q, want only the warning", out)
			}
			var rec map[string]any
			isJSON := json.Unmarshal([]byte(out), &rec) == nil
			if isJSON != tc.json {
				t.Fatalf("format %q wrote %q; JSON %v, want %v", tc.format, out, isJSON, tc.json)
			}
			if tc.json && (rec["msg"] != "kept" || rec["k"] != "v" || rec["level"] != "WARN") {
				t.Fatalf("JSON record %v", rec)
			}
			if !tc.json && !strings.Contains(out, "level=WARN msg=kept k=v") {
				t.Fatalf("text record %q", out)
			}
		})
	}
}
