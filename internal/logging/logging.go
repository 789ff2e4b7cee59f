// Package logging reads the --log-level and --log-format flags that our programs share with
// Linkerd, and builds their slog loggers. Limits: levels are Linkerd's logrus names; formats are
// "plain" (slog's text handler) and "json"; the CNI plugin's file logger is cniplugin's own.
package logging

import (
	"errors"
	"io"
	"log/slog"
	"strings"
)

// LevelTrace is Linkerd's "trace", below slog's debug.
const LevelTrace = slog.LevelDebug - 4

// ParseLevel accepts slog's and logrus's level names in any case; fatal and panic are error.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "trace":
		return LevelTrace, nil
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error", "fatal", "panic":
		return slog.LevelError, nil
	}
	return slog.LevelInfo, errors.New("unknown log level; want trace, debug, info, warn or error")
}

// CheckFormat reports whether format is one New knows by name: plain or json.
func CheckFormat(format string) error {
	if format != "plain" && format != "json" {
		return errors.New("unknown log format; want plain or json")
	}
	return nil
}

// New returns a logger writing to w at level: JSON lines for "json", else slog's text lines.
func New(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
