package cniplugin

// The runtime's trace context. libcni passes the span a runtime's CNI call runs in to the plugin
// in the environment, as OpenTelemetry's environment carriers spell it: TRACEPARENT (a W3C
// traceparent), TRACESTATE and BAGGAGE. The plugin starts no span and talks to no tracing
// backend: it puts the trace ID on every log line of the call and in its report to the node
// agent, so that the call's lines, here and in the agent's log, are found from the runtime's
// trace. TRACESTATE (vendors' data) and BAGGAGE (any key-values, which may be private) are
// neither logged nor kept. Without TRACEPARENT nothing changes: the log lines and the report are
// byte for byte what they were.

import (
	"errors"
	"log/slog"
	"os"
	"strings"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
)

// EnvTraceParent is the variable libcni puts the W3C traceparent of the caller's span in.
const EnvTraceParent = "TRACEPARENT"

// traceContext is what the call keeps of the runtime's trace context.
type traceContext struct {
	// id is the trace ID, when TRACEPARENT holds a valid traceparent.
	id string
	// malformed is a TRACEPARENT that holds none, and why: logged at debug once the logger
	// exists, then ignored.
	malformed, why string
}

// readTrace reads TRACEPARENT from the environment.
func readTrace() traceContext {
	v, ok := os.LookupEnv(EnvTraceParent)
	if !ok {
		return traceContext{}
	}
	id, err := parseTraceParent(v)
	if err != nil {
		const max = 128 // the variable is the caller's: bound what is echoed
		if len(v) > max {
			v = v[:max] + "..."
		}
		return traceContext{malformed: v, why: err.Error()}
	}
	return traceContext{id: id}
}

// attrs appends the trace ID's log attribute to attrs, when there is one.
func (t traceContext) attrs(attrs ...any) []any {
	if t.id == "" {
		return attrs
	}
	return append(attrs, "trace_id", t.id)
}

// logIgnored says, at debug, that a malformed TRACEPARENT was ignored.
func (t traceContext) logIgnored(log *slog.Logger) {
	if t.malformed != "" {
		log.Debug("ignoring "+EnvTraceParent+": not a W3C traceparent", "traceparent", t.malformed, "error", t.why)
	}
}

// parseTraceParent returns the trace ID of a W3C traceparent, version "-" trace-id "-" parent-id
// "-" flags, all lower-case hex. Version 00 has exactly these four fields; a later version may
// add more after the flags, which are ignored, as the specification asks; version ff is invalid.
func parseTraceParent(s string) (string, error) {
	const size = 2 + 1 + 32 + 1 + 16 + 1 + 2
	if len(s) < size || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return "", errors.New("not version-traceid-parentid-flags (2, 32, 16 and 2 hex digits)")
	}
	version, id, parent, flags := s[:2], s[3:35], s[36:52], s[53:55]
	switch {
	case !lowerHex(version) || version == "ff":
		return "", errors.New("version " + version + " is not one")
	case version == "00" && len(s) != size, len(s) > size && s[size] != '-':
		return "", errors.New("version " + version + " with more than four fields")
	case !wire.ValidTraceID(id):
		return "", errors.New("trace ID " + id + " is not 32 lower-case hex digits, not all zero")
	case !lowerHex(parent) || parent == strings.Repeat("0", 16):
		return "", errors.New("parent ID " + parent + " is not 16 lower-case hex digits, not all zero")
	case !lowerHex(flags):
		return "", errors.New("flags " + flags + " are not 2 lower-case hex digits")
	}
	return id, nil
}

func lowerHex(s string) bool {
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
