package cniplugin

// The runtime's trace context: libcni passes the caller's span in the environment, as
// OpenTelemetry's environment carriers spell it (TRACEPARENT, TRACESTATE, BAGGAGE). The plugin
// starts no span: it puts the trace ID on the call's log lines and in its report to the node
// agent. TRACESTATE and BAGGAGE (which may be private) are neither logged nor kept. Without
// TRACEPARENT the log lines and the report are byte for byte what they were.

import (
	"errors"
	"os"
	"strings"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
)

// EnvTraceParent is the variable libcni puts the W3C traceparent of the caller's span in.
const EnvTraceParent = "TRACEPARENT"

// traceContext is what the call keeps of the runtime's trace context: the trace ID, or a
// malformed TRACEPARENT and why, logged at debug once the logger exists, then ignored.
type traceContext struct {
	id, malformed, why string
}

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

func lowerHex(s string) bool { return strings.Trim(s, "0123456789abcdef") == "" }
