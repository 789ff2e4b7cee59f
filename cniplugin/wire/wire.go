// Package wire is the protocol between the linkerd-cni plugin and the node agent over the agent's
// UNIX socket (SOCK_SEQPACKET, one JSON message per datagram), imported by both sides: the
// messages, the typed errors, the plugin's client and the agent's helpers (one bounded message at
// a time, descriptors refused, the peer checked).
//
// One plugin call is one connection: the plugin sends a Request, the agent answers with a Reply,
// and once the call is done the plugin sends a Report. A request's version says what it asks:
//
//   - Version (2), a lookup: the command and the pod it concerns, nothing else (no network config,
//     no file descriptor); the agent answers with the pod, its namespace and default/kubernetes
//     from its watch cache, or an *Error saying why not. The plugin writes (route 2).
//   - WriteVersion (3), a write, ADD only: the pod, CNI_NETNS, the interface and the pod's network
//     namespace as a descriptor (SCM_RIGHTS). The agent checks the descriptor against the file the
//     runtime pinned at CNI_NETNS, builds the rules from the node's own network config and writes
//     them (route 1), answering with Written; or it declines (Declined, with the lookup as for a
//     version-2 request, so the plugin writes without an API request), or refuses (*Error).
//
// An agent older than writes answers a write request with a version-2 refusal: the plugin then
// asks again with a lookup. A plugin older than writes sends only lookups, which the agent
// answers as before. So either side of a rolling upgrade works with the other.
//
// Limits: standard library, golang.org/x/sys and package iptables (for its CapabilityError) only,
// because the plugin links this package and starts on every pod's sandbox set-up. Linux only.
//
// # Tests
//
// Without root: the exchange, each refused message, and the peer checks on this process and on
// stand-in /proc files.
package wire

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/iptables"
)

const (
	// Version is the lookup protocol's version (route 2): requests, replies and reports without
	// a descriptor. Agents and plugins before writes speak only this one.
	Version = 2
	// WriteVersion is the version of a write request (route 1), its reply and its report. A
	// message of any other version is refused.
	WriteVersion = 3
	// MaxMessage bounds one message (one datagram) either way.
	MaxMessage = 128 << 10
	// MaxLog bounds the log text a Report carries.
	MaxLog = 32 << 10
)

// The commands a Request may carry.
const (
	CommandAdd   = "ADD"
	CommandCheck = "CHECK"
	CommandDel   = "DEL"
)

// Request is the plugin's question: the pod of a CNI call, from its CNI_ARGS and
// CNI_CONTAINERID. For ADD and CHECK the agent answers with the pod; for DEL it only learns that
// the sandbox is going (its audits leave it alone).
//
// A write request (V WriteVersion, ADD only) also carries CNI_NETNS and CNI_IFNAME, and the pod's
// network namespace as the one descriptor attached. Nothing else: the network config is the
// node's, which the agent reads itself.
type Request struct {
	V           int    `json:"v"`
	Command     string `json:"command"`
	Namespace   string `json:"namespace"`
	Name        string `json:"name"`
	UID         string `json:"uid,omitempty"`
	ContainerID string `json:"containerID"`
	Netns       string `json:"netns,omitempty"`
	IfName      string `json:"ifName,omitempty"`
}

// Reply is the agent's answer: the core/v1 JSON of the pod, its namespace and, when the agent's
// watch holds it, the Service default/kubernetes (for control-plane pods); or Error. A DEL's
// reply is empty.
type Reply struct {
	V         int             `json:"v"`
	Pod       json.RawMessage `json:"pod,omitempty"`
	Namespace json.RawMessage `json:"namespace,omitempty"`
	Service   json.RawMessage `json:"service,omitempty"`
	Error     *Error          `json:"error,omitempty"`
	// Source, when set, is where the agent read the pod when its watch could not answer:
	// SourceKubelet. Absent: its watch.
	Source string `json:"source,omitempty"`
	// NamespaceError, set in place of Namespace, says why the agent has no namespace to send: its
	// watch has not synced and the API server did not answer its one read. The plugin fails a
	// pod that needs its namespace's annotations with it (closed), and serves any other.
	NamespaceError string `json:"namespaceError,omitempty"`
	// Written, in the reply to a write request, is what the agent did (route 1).
	Written *Written `json:"written,omitempty"`
	// Declined, in the reply to a write request, says why the agent did not write (it cannot,
	// here or now); the reply then holds the lookup, or Error, as for a lookup, and the plugin
	// writes (route 2).
	Declined *Error `json:"declined,omitempty"`
}

// Written is the agent's ADD (route 1): the plugin's own code run with the node's network config
// and the agent's copy of the pod, in the namespace the descriptor named.
type Written struct {
	// Kind is the pod's kind; only meshed kinds get rules.
	Kind string `json:"kind"`
	// Backend and Changed are the write's (empty and false when no rules were needed).
	Backend string `json:"backend,omitempty"`
	Changed bool   `json:"changed,omitempty"`
	// CloseWaitSecs is the conntrack close-wait timeout written (0: left alone).
	CloseWaitSecs int64 `json:"closeWaitSecs,omitempty"`
	// Seconds is how long the agent took, its lookup included.
	Seconds float64 `json:"seconds"`
	// Error, when set, is the ADD's failure, with the CNI code the plugin would have returned:
	// the plugin fails the ADD with it (closed).
	Error *CNIError `json:"error,omitempty"`
	// Log is the ADD's log lines in the agent, truncated to MaxLog, for the plugin's log.
	Log string `json:"log,omitempty"`
}

// CNIError is a CNI error (code, msg, details) as it crosses the socket, so that an ADD fails with
// the same code on both routes.
type CNIError struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
}

// SourceKubelet is a Reply's Source when the pod came from the kubelet's pods API. Replies with
// Source or NamespaceError carry fields a plugin older than them does not know: it refuses the
// reply (malformed) and reads the API itself, as it did before.
const SourceKubelet = "kubelet"

// Report is the plugin's account of the call, sent once it is done, for the agent's metrics and
// log.
type Report struct {
	V       int    `json:"v"`
	Command string `json:"command"`
	// Result is "ok" or "error"; Code is the CNI error code of an error.
	Result string `json:"result"`
	Code   uint   `json:"code,omitempty"`
	// Lookup is where the pod came from: "agent", "api", or "none" (DEL, pass-through).
	Lookup string `json:"lookup"`
	// Route, in the report of a write exchange (V WriteVersion), is who wrote the rules of an
	// ADD: RouteAgent or RoutePlugin ("" when none were written).
	Route string `json:"route,omitempty"`
	// Seconds is the call's duration, from the plugin's start.
	Seconds float64 `json:"seconds"`
	// Log is the plugin's log lines for the call, truncated to MaxLog.
	Log string `json:"log,omitempty"`
	// TraceID is the W3C trace ID of the runtime's span the call ran in (ValidTraceID), when the
	// runtime passed one: the agent links the call's duration to it (an exemplar), never a label.
	// Absent, the report is what it was before the field existed.
	TraceID string `json:"traceID,omitempty"`
}

// The routes of an ADD, in a Report.
const (
	RouteAgent  = "agent"
	RoutePlugin = "plugin"
)

// ValidTraceID reports whether s is a W3C trace ID: 32 lower-case hex digits, not all zero.
func ValidTraceID(s string) bool {
	return len(s) == 32 && s != strings.Repeat("0", 32) && strings.Trim(s, "0123456789abcdef") == ""
}

// Code says why the agent did not answer with a pod.
type Code string

const (
	// CodeNotSynced: the agent's watches have not synced yet.
	CodeNotSynced Code = "not-synced"
	// CodeNotSeen: the pod (or its namespace) is not in the agent's watch within its wait: not
	// of this node, or not delivered yet.
	CodeNotSeen Code = "not-seen"
	// CodeRefused: the peer failed the agent's checks, or attached file descriptors.
	CodeRefused Code = "refused"
	// CodeMalformed: the message did not decode, or named an unknown command or field.
	CodeMalformed Code = "malformed"
	// CodeTooLarge: a message larger than MaxMessage.
	CodeTooLarge Code = "too-large"
	// CodeVersion: another protocol version.
	CodeVersion Code = "version"
	// CodeCapability, in a Declined: the agent lacks a capability writing needs (NET_ADMIN and
	// SYS_ADMIN: the chart grants them only with audits), or the kernel refused a write for want
	// of one. The plugin writes.
	CodeCapability Code = "capability"
	// CodeCannotWrite, in a Declined: the agent cannot write this pod's rules for another reason
	// (no network config of linkerd-cni on the node yet, a mode whose binaries its image lacks, a
	// namespace it cannot verify, a failed write). The plugin writes.
	CodeCannotWrite Code = "cannot-write"
)

// Error is a typed refusal, sent in a Reply and returned by both sides' helpers.
type Error struct {
	Code    Code   `json:"code"`
	Message string `json:"message"`
	// Capability, set in every CodeCapability error (CapabilityErrorf), is the capability error
	// itself, so that it stays one across the socket: errors.As finds the *iptables.CapabilityError
	// in the *Error (Unwrap), as in the plugin's own write. An agent older than the field sends
	// none; a plugin older than it refuses a reply that carries it (malformed) and writes itself.
	Capability *Capability `json:"capability,omitempty"`
}

func (e *Error) Error() string { return "node agent: " + string(e.Code) + ": " + e.Message }

// Unwrap returns the *iptables.CapabilityError that Capability carries, or nil.
func (e *Error) Unwrap() error {
	c := e.Capability
	if c == nil {
		return nil
	}
	return &iptables.CapabilityError{Caps: slices.Clone(c.Caps), NetNS: c.NetNS, Op: c.Op, Err: remoteErr{msg: c.Err, errno: unix.Errno(c.Errno)}}
}

// Capability is an *iptables.CapabilityError as it crosses the socket: its fields, its error's
// text, and the kernel's error number under it (EPERM, EACCES) when there was one, so that
// errors.Is(err, fs.ErrPermission) holds on both sides.
type Capability struct {
	Caps  []string `json:"caps"`
	NetNS string   `json:"netns,omitempty"`
	Op    string   `json:"op"`
	Err   string   `json:"err,omitempty"`
	Errno uintptr  `json:"errno,omitempty"`
}

// CapabilityErrorf returns the CodeCapability *Error for ce, with the message format says.
func CapabilityErrorf(ce *iptables.CapabilityError, format string, args ...any) *Error {
	e := Errorf(CodeCapability, format, args...)
	e.Capability = &Capability{Caps: ce.Caps, NetNS: ce.NetNS, Op: ce.Op}
	if ce.Err != nil {
		e.Capability.Err = ce.Err.Error()
		var errno unix.Errno
		if errors.As(ce.Err, &errno) {
			e.Capability.Errno = uintptr(errno)
		}
	}
	return e
}

// remoteErr is the error under a CapabilityError that crossed the socket: its text, and its
// error number when it had one.
type remoteErr struct {
	msg   string
	errno unix.Errno
}

func (e remoteErr) Error() string { return e.msg }

func (e remoteErr) Unwrap() error {
	if e.errno == 0 {
		return nil
	}
	return e.errno
}

// Errorf returns an *Error of code.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// CodeOf returns the code of the *Error in err's chain, or "".
func CodeOf(err error) Code {
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return ""
}

// TruncateLog bounds log text to MaxLog, keeping whole lines from the start.
func TruncateLog(s string) string {
	if len(s) <= MaxLog {
		return s
	}
	cut := s[:MaxLog]
	if i := strings.LastIndexByte(cut, '\n'); i >= 0 {
		cut = cut[:i+1]
	}
	return cut + "(log truncated)\n"
}
