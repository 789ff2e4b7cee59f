package validator

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/internal/origdst"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
	// ExitRedirectFailed is Linkerd's "the redirect does not work"; the repair controller deletes
	// pods whose validator exited with it.
	ExitRedirectFailed = 95
)

// Reason says which part of a check failed.
type Reason string

const (
	// ReasonNotRedirected: no connection arrived on the listener; outbound TCP is not redirected.
	ReasonNotRedirected Reason = "not-redirected"
	// ReasonTokenMismatch: the connection was answered, but not by the validator's listener.
	ReasonTokenMismatch Reason = "token-mismatch"
	// ReasonWrongOriginalDst: the connection reached the listener, not NATed from ConnectAddr.
	ReasonWrongOriginalDst Reason = "wrong-original-destination"
	// ReasonProxyUIDRedirected: the proxy UID's connection was redirected: it would loop.
	ReasonProxyUIDRedirected Reason = "proxy-uid-redirected"
	// ReasonDestinationRewritten: the connection was redirected, but from another address than
	// the one dialled, as Cilium's socket-level load balancing does to a Service's ClusterIP.
	ReasonDestinationRewritten Reason = "destination-rewritten"
)

// SocketLBHint is what the validator says about a rewritten destination.
const SocketLBHint = "something rewrote the destination before the pod's netfilter rules saw it. " +
	"Cilium's socket-level load balancing does that to a Service's ClusterIP, and the proxy then " +
	"sees a backend's address instead of the Service's, and loses its load balancing and policy: " +
	"set socketLB.hostNamespaceOnly=true in Cilium's Helm values (docs/troubleshooting.md, Cilium)"

// Failure is a check that proved the redirect does not work; it maps to ExitRedirectFailed.
// Run may return several, joined with errors.Join; find them with errors.As.
type Failure struct {
	// Check names the check: "ipv4", "ipv6", "proxy-uid ipv4", "proxy-uid ipv6".
	Check                   string
	Reason                  Reason
	ConnectAddr, ListenAddr string
	Detail                  string // for people
	Err                     error  // the underlying error, if any (a dial error, say)
}

func (f *Failure) Error() string {
	msg := fmt.Sprintf("%s check failed (%s): %s", f.Check, f.Reason, f.Detail)
	if f.Err != nil {
		msg += ": " + f.Err.Error()
	}
	return msg
}

func (f *Failure) Unwrap() error { return f.Err }

// ExitCode maps an error from Parse or Run to the exit code: 0, 95 (a check failed), 2 or 1.
func ExitCode(err error) int {
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, new(*Failure)):
		return ExitRedirectFailed
	case errors.As(err, new(*badinput.UsageError)):
		return ExitUsage
	}
	return ExitFailure
}

// uidCheckWait bounds the proxy UID check's dial: a redirected connect completes locally in under
// a millisecond, and an exempt one (TTL 1) never does, so waiting longer only slows pod starts.
const uidCheckWait = 2 * time.Second

// check is one family's redirect check.
type check struct {
	name            string // "ipv4" or "ipv6"
	connect, listen netip.AddrPort
}

// checks lists what c asks for; c has passed Validate.
func (c Config) checks() []check {
	connect := netip.MustParseAddrPort(c.ConnectAddr)
	listen := netip.MustParseAddrPort(c.ListenAddr)
	name := "ipv6"
	if connect.Addr().Unmap().Is4() {
		name = "ipv4"
	}
	out := []check{{name: name, connect: connect, listen: listen}}
	if c.IPv6 && !connect.Addr().Unmap().Is6() {
		v6 := check{name: "ipv6", connect: netip.MustParseAddrPort(c.IPv6ConnectAddr),
			listen: netip.AddrPortFrom(netip.IPv6Unspecified(), listen.Port())}
		if c.IPv6ListenAddr != "" {
			v6.listen = netip.MustParseAddrPort(c.IPv6ListenAddr)
		}
		out = append(out, v6)
	}
	return out
}

// Run performs every check c asks for and returns nil when the redirect works; else one *Failure
// per failed check (exit 95). An error without one (the port taken, say) says nothing about it.
func Run(ctx context.Context, c Config, log *slog.Logger) error {
	if err := c.Validate(); err != nil {
		return err
	}
	// Every check runs, so the log names everything wrong; a proven failure decides the exit code.
	var errs []error
	for _, ck := range c.checks() {
		if err := runCheck(ctx, c, ck, log); err != nil {
			errs = append(errs, err)
		}
		if ctxErr := ctx.Err(); ctxErr != nil {
			return fmt.Errorf("validation interrupted: %w", ctxErr)
		}
	}
	return errors.Join(errs...)
}

// runCheck proves that a connection to ck.connect lands on ck.listen with ck.connect as its
// original destination, and then, if asked, that the proxy UID's connections do not.
func runCheck(ctx context.Context, c Config, ck check, log *slog.Logger) error {
	log = log.With("check", ck.name, "connect_addr", ck.connect.String(), "listen_addr", ck.listen.String())
	srv, err := listen(ctx, ck, c.Timeout)
	if err != nil {
		return err
	}
	defer srv.close()

	start := time.Now()
	fail := func(reason Reason, err error, format string, args ...any) error {
		return &Failure{Check: ck.name, Reason: reason, ConnectAddr: ck.connect.String(), ListenAddr: ck.listen.String(),
			Detail: fmt.Sprintf(format, args...), Err: err}
	}
	token := newToken()
	ctx, cancel := context.WithTimeout(ctx, c.Timeout)
	defer cancel()
	reply, connected, err := exchange(ctx, ck.connect, token)
	if !connected {
		return fail(ReasonNotRedirected, err,
			"no connection arrived on %s within %s: outbound TCP to %s is not redirected to the proxy port",
			ck.listen, c.Timeout, ck.connect)
	}
	if reply != token {
		got := fmt.Sprintf("%q", reply)
		if reply == "" {
			got = "no reply"
		}
		return fail(ReasonTokenMismatch, err,
			"the connection to %s was answered, but not by the validator listening on %s (sent token %s, got %s): outbound TCP reached something else",
			ck.connect, ck.listen, token, got)
	}
	a, ok := srv.await(ctx, token)
	if !ok {
		// The listener records a connection before echoing its token: another process echoed it.
		return fail(ReasonTokenMismatch, nil, "the token was echoed, but the validator's listener on %s never saw the connection", ck.listen)
	}
	switch {
	case a.origErr != nil:
		return fail(ReasonWrongOriginalDst, a.origErr,
			"the connection reached %s without being NATed (no original destination): it was not redirected", ck.listen)
	case a.origDst == a.local:
		return fail(ReasonWrongOriginalDst, nil,
			"the connection reached %s directly (its original destination %s is the listener itself): it was not redirected", ck.listen, a.origDst)
	case a.origDst != unmap(ck.connect):
		return fail(ReasonDestinationRewritten, nil,
			"the redirected connection's original destination is %s, not %s, the address dialled: %s", a.origDst, ck.connect, SocketLBHint)
	}
	log.Info("outbound redirect works", "original_dst", a.origDst.String(), "landed_on", a.local.String(),
		"elapsed", time.Since(start).Round(time.Microsecond).String())

	if c.ProxyUID < 0 {
		return nil
	}
	return checkUID(ctx, c, ck, srv, log)
}

// checkUID expects a connection to ck.connect made as the proxy UID NOT to reach the listener.
func checkUID(ctx context.Context, c Config, ck check, srv *server, log *slog.Logger) error {
	token := newToken()
	wait := min(c.Timeout, uidCheckWait)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	type result struct {
		reply     string
		connected bool
		skipped   error
	}
	done := make(chan result, 1)
	go func() {
		// The thread switches its own credentials and is never unlocked, so the runtime
		// destroys it when this goroutine ends instead of reusing a thread with another UID.
		runtime.LockOSThread()
		if err := setThreadUID(c.ProxyUID); err != nil {
			done <- result{skipped: err}
			return
		}
		reply, connected, _ := exchange(ctx, ck.connect, token)
		done <- result{reply, connected, nil}
	}()
	r := <-done
	uidLog := log.With("proxy_uid", c.ProxyUID)
	switch {
	case r.skipped != nil:
		uidLog.Warn("proxy UID check skipped: switching to that UID needs root or CAP_SETUID", "error", r.skipped.Error())
		return nil
	case r.connected && r.reply == token:
		return &Failure{Check: "proxy-uid " + ck.name, Reason: ReasonProxyUIDRedirected,
			ConnectAddr: ck.connect.String(), ListenAddr: ck.listen.String(),
			Detail: fmt.Sprintf("a connection to %s made as the proxy UID %d was redirected to %s: the proxy's own traffic would loop back into it (is --proxy-uid %d exempt in the rules?)",
				ck.connect, c.ProxyUID, ck.listen, c.ProxyUID)}
	}
	how := "the connection did not complete"
	if r.connected {
		how = "the connection was answered by something other than the validator"
	}
	uidLog.Info("proxy UID is not redirected", "evidence", how, "waited", wait.String())
	return nil
}

// setThreadUID switches only the calling OS thread to uid (syscall.Setresuid switches them all).
func setThreadUID(uid int) error {
	u := uintptr(uid)
	if _, _, errno := unix.RawSyscall(unix.SYS_SETRESUID, u, u, u); errno != 0 {
		return fmt.Errorf("setresuid %d: %w", uid, errno)
	}
	return nil
}

// exchange connects to addr (connected says if it did), sends token and reads one line back.
func exchange(ctx context.Context, addr netip.AddrPort, token string) (reply string, connected bool, err error) {
	// The literal picks the family; Control is told it ("tcp4" or "tcp6").
	d := net.Dialer{Control: hopLimitOne}
	conn, err := d.DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return "", false, err
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, token+"\n"); err != nil {
		return "", true, fmt.Errorf("send token: %w", err)
	}
	line, err := bufio.NewReader(io.LimitReader(conn, 256)).ReadString('\n')
	if err != nil && line == "" {
		return "", true, fmt.Errorf("read reply: %w", err)
	}
	return strings.TrimSpace(line), true, nil
}

// hopLimitOne keeps a connection that is not redirected from reaching the connect address: its SYN
// expires at the first router. A redirected one is delivered locally.
func hopLimitOne(network, _ string, rc syscall.RawConn) error {
	level, opt := unix.IPPROTO_IP, unix.IP_TTL
	if strings.HasSuffix(network, "6") {
		level, opt = unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS
	}
	var serr error
	if err := rc.Control(func(fd uintptr) { serr = unix.SetsockoptInt(int(fd), level, opt, 1) }); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("set hop limit 1: %w", serr)
	}
	return nil
}

// newToken returns a value a stray server cannot guess by accident. math/rand/v2 is seeded by the
// kernel; crypto/rand would add its set-up to every run of proxy-init, which shares this binary.
func newToken() string {
	return fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
}

// arrival is one connection the listener accepted.
type arrival struct {
	token   string
	local   netip.AddrPort
	origDst netip.AddrPort
	origErr error
}

// server is the listener standing in for the proxy's outbound port.
type server struct {
	ln       net.Listener
	timeout  time.Duration
	arrivals chan arrival
	wg       sync.WaitGroup // the accept loop
}

func listen(ctx context.Context, ck check, timeout time.Duration) (*server, error) {
	network := "tcp6"
	switch {
	case ck.listen.Addr().Unmap().Is4():
		network = "tcp4"
	case ck.listen.Addr().IsUnspecified() && ck.connect.Addr().Unmap().Is4():
		// [::] with an IPv4 connect address: a dual-stack socket receives it.
		network = "tcp"
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, network, ck.listen.String())
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", ck.listen, err)
	}
	s := &server{ln: ln, timeout: timeout, arrivals: make(chan arrival, 16)}
	s.wg.Go(s.serve)
	return s, nil
}

func (s *server) serve() {
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			return // closed
		}
		// Handlers are not waited for: each ends at its deadline; a stray must not delay exit.
		go s.handle(conn.(*net.TCPConn))
	}
}

// handle records the connection, then echoes its token, so a client that read it finds it queued.
func (s *server) handle(conn *net.TCPConn) {
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(s.timeout))
	line, _ := bufio.NewReader(io.LimitReader(conn, 256)).ReadString('\n')
	token := strings.TrimSpace(line)
	a := arrival{token: token, local: unmap(conn.LocalAddr().(*net.TCPAddr).AddrPort())}
	a.origDst, a.origErr = origdst.Lookup(conn)
	select {
	case s.arrivals <- a:
	default: // a flood of stray connections; ours will still be looked for among the rest
	}
	_, _ = io.WriteString(conn, token+"\n")
}

// await returns the arrival carrying token, skipping strays, or false when ctx ends first.
func (s *server) await(ctx context.Context, token string) (arrival, bool) {
	for {
		select {
		case a := <-s.arrivals:
			if a.token == token {
				return a, true
			}
		case <-ctx.Done():
			return arrival{}, false
		}
	}
}

func (s *server) close() {
	s.ln.Close()
	s.wg.Wait()
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}
