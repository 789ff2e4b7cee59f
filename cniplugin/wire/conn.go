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
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Exchange is one plugin call's connection to the agent, open from the request to the report.
type Exchange struct {
	conn  *net.UnixConn
	Reply Reply
}

// Ask checks the socket (CheckSocket), connects, sends req and reads the reply, all within
// timeout. When the agent answers with an *Error, Ask returns it with the exchange, which still
// takes the report; any other error means there is no exchange.
func Ask(socket string, timeout time.Duration, req Request) (*Exchange, error) {
	if err := CheckSocket(socket); err != nil {
		return nil, err
	}
	req.V = Version
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(timeout)
	c, err := (&net.Dialer{Deadline: deadline}).Dial("unixpacket", socket)
	if err != nil {
		return nil, err
	}
	conn := c.(*net.UnixConn)
	ex := &Exchange{conn: conn}
	if err := conn.SetDeadline(deadline); err != nil {
		conn.Close()
		return nil, err
	}
	if _, err := conn.Write(body); err != nil {
		conn.Close()
		return nil, fmt.Errorf("send the request: %w", err)
	}
	b, err := readMessage(conn, make([]byte, MaxMessage))
	if err == nil {
		err = decode(b, &ex.Reply)
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		conn.Close()
		return nil, fmt.Errorf("no answer within %s: %w", timeout, err)
	case err != nil:
		conn.Close()
		return nil, fmt.Errorf("the agent's answer: %w", err)
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
	r.V, r.Log = Version, TruncateLog(r.Log)
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

// ReadRequest reads the plugin's request. Its errors are *Error (refused: descriptors attached;
// too-large; version; malformed: not JSON, an unknown field or command) or the connection's.
func ReadRequest(conn *net.UnixConn) (Request, error) {
	var req Request
	b, err := readMessage(conn, make([]byte, MaxMessage))
	if err == nil {
		err = decode(b, &req)
	}
	switch {
	case err != nil:
	case req.Command != CommandAdd && req.Command != CommandCheck && req.Command != CommandDel:
		err = Errorf(CodeMalformed, "command %q, want ADD, CHECK or DEL", req.Command)
	case req.Command != CommandDel && (req.Namespace == "" || req.Name == ""):
		err = Errorf(CodeMalformed, "no pod namespace and name in a %s request", req.Command)
	}
	return req, err
}

// Answer sends r. One larger than a message goes as CodeTooLarge instead, so that the plugin reads
// the pod itself at once.
func Answer(conn *net.UnixConn, r Reply) error {
	r.V = Version
	b, err := json.Marshal(r)
	if err == nil && len(b) > MaxMessage {
		b, err = json.Marshal(Reply{V: Version, Error: Errorf(CodeTooLarge, "the answer is %d bytes, more than the %d of a message", len(b), MaxMessage)})
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
	b, err := readMessage(conn, make([]byte, MaxMessage))
	if err == nil {
		err = decode(b, &r)
	}
	return r, err
}

// readMessage reads one datagram into buf with no room for control messages: descriptors the
// peer attached are closed by the kernel, never installed in this process, and refused.
func readMessage(conn *net.UnixConn, buf []byte) ([]byte, error) {
	n, _, flags, _, err := conn.ReadMsgUnix(buf, nil)
	switch {
	case err != nil:
		return nil, err
	case flags&unix.MSG_CTRUNC != 0:
		return nil, Errorf(CodeRefused, "file descriptors attached (protocol %d carries none); closed unused", Version)
	case flags&unix.MSG_TRUNC != 0:
		return nil, Errorf(CodeTooLarge, "a message larger than %d bytes", MaxMessage)
	case n == 0:
		return nil, io.EOF
	}
	return buf[:n], nil
}

// decode reads a message of this protocol version into v, refusing unknown fields: a field of
// another version's message (a network config, a namespace descriptor) is never ignored.
func decode(b []byte, v any) error {
	var head struct {
		V int `json:"v"`
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return Errorf(CodeMalformed, "%v", err)
	}
	if head.V != Version {
		return Errorf(CodeVersion, "protocol version %d, want %d", head.V, Version)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(CodeMalformed, "%v", err)
	}
	return nil
}
