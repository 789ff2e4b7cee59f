package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Exchange is one plugin call's connection to the agent, open from the request to the report.
type Exchange struct {
	conn  *net.UnixConn
	v     int // the request's version, which the report takes
	Reply Reply
}

// Ask checks the socket (CheckSocket), connects, sends req and reads the reply, all within
// timeout. When the agent answers with an *Error, Ask returns it with the exchange, which still
// takes the report; any other error means there is no exchange.
func Ask(socket string, timeout time.Duration, req Request) (*Exchange, error) {
	req.V, req.Netns, req.IfName = Version, "", ""
	return exchange(socket, timeout, req, nil)
}

// AskWrite asks the agent to write an ADD's rules (route 1): req (Command ADD, with Netns and
// IfName) goes with netns, the pod's network namespace, attached. Its answers are Ask's, and:
// the reply's Written when the agent wrote, or its Declined with the lookup when it did not. An
// agent that speaks only lookups (version 2) answers with a refusal of its own version: AskWrite
// returns a CodeVersion *Error and no exchange, and the plugin asks again with Ask.
func AskWrite(socket string, timeout time.Duration, req Request, netns *os.File) (*Exchange, error) {
	req.V, req.Command = WriteVersion, CommandAdd
	return exchange(socket, timeout, req, netns)
}

func exchange(socket string, timeout time.Duration, req Request, netns *os.File) (ex *Exchange, err error) {
	if err := CheckSocket(socket); err != nil {
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	var oob []byte
	if netns != nil {
		oob = unix.UnixRights(int(netns.Fd()))
	}
	deadline := time.Now().Add(timeout)
	c, err := (&net.Dialer{Deadline: deadline}).Dial("unixpacket", socket)
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	defer func() {
		if ex == nil {
			conn.Close()
		}
	}()
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	if _, _, err := conn.WriteMsgUnix(body, oob, nil); err != nil {
		return nil, fmt.Errorf("send the request: %w", err)
	}
	ex = &Exchange{conn: conn, v: req.V}
	b, _, err := readMessage(conn, make([]byte, MaxMessage), false)
	if err == nil {
		// The reply to a write may come from an agent that speaks only lookups.
		_, err = decode(b, &ex.Reply, req.V)
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return nil, fmt.Errorf("no answer within %s: %w", timeout, err)
	case err != nil:
		return nil, fmt.Errorf("the agent's answer: %w", err)
	case ex.Reply.V != req.V:
		msg := "the agent's reply"
		if ex.Reply.Error != nil {
			msg = ex.Reply.Error.Error()
		}
		return nil, Errorf(CodeVersion, "the agent answered a version %d request in version %d (an agent older than writes): %s", req.V, ex.Reply.V, msg)
	case ex.Reply.Error != nil:
		return ex, ex.Reply.Error
	}
	return ex, nil
}

// Report sends r, best effort and without waiting for the agent, and closes the exchange. On a
// nil Exchange (no agent) it does nothing.
func (e *Exchange) Report(r Report) {
	if e == nil {
		return
	}
	defer e.conn.Close()
	r.V, r.Log = e.v, TruncateLog(r.Log)
	if r.V != WriteVersion {
		r.Route = "" // not a field of version 2's report
	}
	b, err := json.Marshal(r)
	if err != nil || len(b) > MaxMessage {
		return
	}
	_ = e.conn.SetWriteDeadline(time.Now().Add(50 * time.Millisecond))
	_, _ = e.conn.Write(b)
}

// CheckSocket refuses a socket the plugin must not trust, since it acts on the agent's answer: one
// that is not a socket, or that anyone but root owns, or whose directory anyone but root owns or
// may write.
func CheckSocket(path string) error {
	for _, c := range []struct {
		path string
		typ  fs.FileMode
		what string
	}{{filepath.Dir(path), fs.ModeDir, "a directory"}, {path, fs.ModeSocket, "a socket"}} {
		fi, err := os.Lstat(c.path)
		if err != nil {
			return err
		}
		if fi.Mode().Type() != c.typ {
			return fmt.Errorf("%s is not %s (mode %s)", c.path, c.what, fi.Mode())
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); !ok || st.Uid != 0 {
			return fmt.Errorf("%s is not owned by root", c.path)
		}
		if c.typ == fs.ModeDir && fi.Mode().Perm()&0o022 != 0 {
			return fmt.Errorf("%s is writable by others than root (mode %o)", c.path, fi.Mode().Perm())
		}
	}
	return nil
}

// ReadRequest reads the plugin's request, and for a write request (WriteVersion) the namespace
// descriptor attached, which the caller closes. Its errors are *Error (refused: descriptors
// attached to a lookup, or more than one; too-large; version; malformed: not JSON, an unknown
// field or command, a write request without its descriptor or not an ADD) or the connection's;
// with an error no descriptor is returned, none is left open.
func ReadRequest(conn *net.UnixConn) (Request, *os.File, error) {
	var req Request
	v, fd, err := read(conn, &req, true)
	var ve *Error
	switch {
	case fd != nil && (req.V != WriteVersion || errors.As(err, &ve) && ve.Code == CodeVersion):
		err = Errorf(CodeRefused, "file descriptors attached (protocol %d carries none); closed unused", Version)
	case err != nil:
	case req.Command != CommandAdd && req.Command != CommandCheck && req.Command != CommandDel:
		err = Errorf(CodeMalformed, "command %q, want ADD, CHECK or DEL", req.Command)
	case req.Command != CommandDel && (req.Namespace == "" || req.Name == ""):
		err = Errorf(CodeMalformed, "no pod namespace and name in a %s request", req.Command)
	case req.V == WriteVersion && req.Command != CommandAdd:
		err = Errorf(CodeMalformed, "a write request for %s: only ADD writes", req.Command)
	case req.V == WriteVersion && fd == nil:
		err = Errorf(CodeMalformed, "a write request without the pod's network namespace attached")
	case req.V == WriteVersion && req.Netns == "":
		err = Errorf(CodeMalformed, "a write request without its CNI_NETNS")
	case req.V == Version && (req.Netns != "" || req.IfName != ""):
		err = Errorf(CodeMalformed, "a lookup (version %d) with netns or ifName", Version)
	}
	if err != nil {
		if fd != nil {
			fd.Close()
			fd = nil
		}
		// The refusal is answered in the version the peer speaks, when it is one of ours.
		req.V = v
	}
	return req, fd, err
}

// Answer sends r, in r's version (Version when unset). One larger than a message goes as
// CodeTooLarge instead, so that the plugin reads the pod itself at once.
func Answer(conn *net.UnixConn, r Reply) error {
	if r.V == 0 {
		r.V = Version
	}
	b, err := json.Marshal(r)
	if err == nil && len(b) > MaxMessage {
		b, err = json.Marshal(Reply{V: r.V, Error: Errorf(CodeTooLarge, "the answer is %d bytes, more than the %d of a message", len(b), MaxMessage)})
	}
	if err != nil {
		return err
	}
	_, err = conn.Write(b)
	return err
}

// ReadReport reads the plugin's report, within the connection's deadline.
func ReadReport(conn *net.UnixConn) (Report, error) {
	var r Report
	_, _, err := read(conn, &r, false)
	return r, err
}

// messageBufs are the agent's read buffers, MaxMessage bytes each: it reads two messages per
// plugin call (ReadRequest, ReadReport), whose decoded values keep nothing of the buffer, and a
// fresh 128 KiB each time is garbage the collector must then clear.
var messageBufs = sync.Pool{New: func() any {
	b := make([]byte, MaxMessage)
	return &b
}}

// read reads one message of either version into v, in a buffer of messageBufs, and returns the
// descriptor attached (oneFD: readMessage) and the message's version when it is one of ours.
func read(conn *net.UnixConn, v any, oneFD bool) (int, *os.File, error) {
	buf := messageBufs.Get().(*[]byte)
	defer messageBufs.Put(buf)
	b, fd, err := readMessage(conn, *buf, oneFD)
	if err != nil {
		return 0, nil, err
	}
	version, err := decode(b, v, WriteVersion)
	return version, fd, err
}

// readMessage reads one datagram into buf. Without oneFD there is no room for control messages:
// descriptors the peer attached are closed by the kernel, never installed in this process, and
// refused. With oneFD there is room for one descriptor, returned; more, or anything else than
// SCM_RIGHTS, is refused and whatever was received closed.
func readMessage(conn *net.UnixConn, buf []byte, oneFD bool) ([]byte, *os.File, error) {
	var oob []byte
	if oneFD {
		oob = make([]byte, unix.CmsgSpace(4))
	}
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	if err != nil {
		return nil, nil, err
	}
	fds, fdErr := receivedFDs(oob[:oobn])
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	switch {
	case flags&unix.MSG_CTRUNC != 0 && oneFD, len(fds) > 1:
		closeAll()
		return nil, nil, Errorf(CodeRefused, "more than one file descriptor attached; closed unused")
	case flags&unix.MSG_CTRUNC != 0:
		return nil, nil, Errorf(CodeRefused, "file descriptors attached (protocol %d carries none); closed unused", Version)
	case fdErr != nil:
		closeAll()
		return nil, nil, Errorf(CodeRefused, "control message: %v", fdErr)
	case flags&unix.MSG_TRUNC != 0:
		closeAll()
		return nil, nil, Errorf(CodeTooLarge, "a message larger than %d bytes", MaxMessage)
	case n == 0:
		closeAll()
		return nil, nil, io.EOF
	}
	var f *os.File
	if len(fds) == 1 {
		f = os.NewFile(uintptr(fds[0]), "netns")
	}
	return buf[:n], f, nil
}

// receivedFDs returns the descriptors of the SCM_RIGHTS messages in oob; anything else is an
// error (with the descriptors found so far, for the caller to close).
func receivedFDs(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	for _, m := range msgs {
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			return fds, err
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// decode reads a message of a version from Version to maxV into v, and returns its version (0
// when it is not one of those), refusing unknown fields: a field of another version's message (a
// network config, a namespace descriptor) is never ignored.
func decode(b []byte, v any, maxV int) (int, error) {
	var head struct {
		V int `json:"v"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return 0, Errorf(CodeMalformed, "%v", err)
	}
	if head.V < Version || head.V > maxV {
		want := strconv.Itoa(Version) // the versions are consecutive: Version and WriteVersion
		if maxV > Version {
			want += " or " + strconv.Itoa(maxV)
		}
		return 0, Errorf(CodeVersion, "protocol version %d, want %s", head.V, want)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return head.V, Errorf(CodeMalformed, "%v", err)
	}
	return head.V, nil
}
