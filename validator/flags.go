package validator

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/pflag"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/internal/logging"
	"github.com/kubemesh/proxy-init/iptables"
)

// Defaults: Linkerd's validator's (its chart passes --connect-addr 1.1.1.1:20001, or
// [fd00::1]:20001 on IPv6, the --ipv6 check's default).
const (
	DefaultConnectAddr     = "192.0.2.2:1404"
	DefaultListenAddr      = "0.0.0.0:4140"
	DefaultIPv6ConnectAddr = "[fd00::1]:20001"
	DefaultTimeout         = 10 * time.Second
)

// Flag names. The first five are Linkerd's; the rest are ours.
const (
	FlagConnectAddr     = "connect-addr"
	FlagListenAddr      = "listen-addr"
	FlagTimeout         = "timeout"
	FlagLogFormat       = "log-format"
	FlagLogLevel        = "log-level"
	FlagIPv6            = "ipv6"
	FlagIPv6ConnectAddr = "ipv6-connect-addr"
	FlagIPv6ListenAddr  = "ipv6-listen-addr"
	FlagProxyUID        = "proxy-uid"
)

// Target is the validator's tracing target in Linkerd: --log-level directives for it apply to us.
const Target = "linkerd_network_validator"

// Linkerd's validator also takes its log flags from these variables; a flag wins.
const (
	EnvLogLevel  = "LINKERD_NETWORK_VALIDATOR_LOG_LEVEL"
	EnvLogFormat = "LINKERD_NETWORK_VALIDATOR_LOG_FORMAT"
)

// Config is what the validator checks. The zero value is not useful; start from DefaultConfig.
type Config struct {
	// ConnectAddr is dialled and must be redirected to ListenAddr, the outbound proxy port.
	ConnectAddr, ListenAddr string
	// Timeout bounds each check's wait for the redirected connection.
	Timeout             time.Duration
	LogFormat, LogLevel string
	// IPv6 adds an IPv6 check of IPv6ConnectAddr against IPv6ListenAddr (empty: [::] on
	// ListenAddr's port). It is skipped when ConnectAddr already is IPv6.
	IPv6                            bool
	IPv6ConnectAddr, IPv6ListenAddr string
	// ProxyUID, when not -1, is checked to be exempt from the redirect.
	ProxyUID int
}

// DefaultConfig returns the defaults of every flag.
func DefaultConfig() Config {
	return Config{
		ConnectAddr:     DefaultConnectAddr,
		ListenAddr:      DefaultListenAddr,
		Timeout:         DefaultTimeout,
		LogFormat:       "plain",
		LogLevel:        "info",
		IPv6ConnectAddr: DefaultIPv6ConnectAddr,
		ProxyUID:        -1,
	}
}

// flagSet holds the validator's flags, bound to c, with c's values as defaults.
func (c *Config) flagSet() *pflag.FlagSet {
	fs := pflag.NewFlagSet("validate", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false
	fs.StringVar(&c.ConnectAddr, FlagConnectAddr, c.ConnectAddr, "address to connect to; the connection must be redirected to --listen-addr (it is never really reached)")
	fs.StringVar(&c.ListenAddr, FlagListenAddr, c.ListenAddr, "address to listen on: the proxy's outbound port")
	fs.DurationVar(&c.Timeout, FlagTimeout, c.Timeout, "how long to wait for the redirected connection")
	fs.StringVar(&c.LogFormat, FlagLogFormat, c.LogFormat, "log format: plain or json (logs go to stderr)")
	fs.StringVar(&c.LogLevel, FlagLogLevel, c.LogLevel, "log level: trace, debug, info, warn, error, or a filter such as "+Target+"=debug,warn")
	fs.BoolVar(&c.IPv6, FlagIPv6, c.IPv6, "also check IPv6, connecting to --ipv6-connect-addr")
	fs.StringVar(&c.IPv6ConnectAddr, FlagIPv6ConnectAddr, c.IPv6ConnectAddr, "IPv6 address to connect to when --ipv6 is set")
	fs.StringVar(&c.IPv6ListenAddr, FlagIPv6ListenAddr, c.IPv6ListenAddr, "IPv6 address to listen on when --ipv6 is set (default [::] on --listen-addr's port)")
	fs.IntVar(&c.ProxyUID, FlagProxyUID, c.ProxyUID, "also check that this UID's connections are NOT redirected (-1: skip; needs root or CAP_SETUID, else skipped with a log line)")
	return fs
}

// ErrHelp is returned by Parse for -h and --help.
var ErrHelp = pflag.ErrHelp

// Parse turns the arguments after "validate" into a Config, log defaults from EnvLogLevel/Format.
func Parse(args []string) (Config, error) { return ParseEnv(args, os.Getenv) }

// ParseEnv is Parse with the environment read through getenv.
func ParseEnv(args []string, getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	c.LogLevel = cmp.Or(getenv(EnvLogLevel), c.LogLevel)
	c.LogFormat = cmp.Or(getenv(EnvLogFormat), c.LogFormat)
	fs := c.flagSet()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return c, ErrHelp
		}
		return c, &badinput.UsageError{Message: err.Error() + " (see proxy-init validate --help)"}
	}
	if fs.NArg() > 0 {
		return c, &badinput.UsageError{Message: fmt.Sprintf("unexpected arguments %q (see proxy-init validate --help)", fs.Args())}
	}
	return c, c.Validate()
}

// Usage is the help text of `proxy-init validate`.
func Usage() string {
	c := DefaultConfig()
	return `proxy-init validate proves that the pod's outbound TCP is redirected to the proxy port.

Usage:
  proxy-init validate [flags]

Flags:
` + c.flagSet().FlagUsages() + `
Exit codes: 0 the redirect works, 95 it does not (the message says what failed), 2 bad usage, 1 other errors.
`
}

// Validate reports every problem in c at once, naming the flag and value.
func (c Config) Validate() error {
	var probs []badinput.Problem
	bad := func(flag, value, reason string) {
		probs = append(probs, badinput.Problem{Field: "--" + flag, Value: value, Reason: reason})
	}
	addr := func(flag, value string, v6 bool) {
		ap, err := netip.ParseAddrPort(value)
		switch {
		case err != nil:
			bad(flag, value, "want an IP address and port, such as 1.1.1.1:20001 or [fd00::1]:20001")
		case ap.Port() == 0:
			bad(flag, value, "port 0 cannot be connected to")
		case ap.Addr().Zone() != "":
			bad(flag, value, "zoned addresses are not supported")
		}
		if err == nil && v6 && (!ap.Addr().Is6() || ap.Addr().Is4In6()) {
			bad(flag, value, "not an IPv6 address")
		}
	}
	addr(FlagConnectAddr, c.ConnectAddr, false)
	addr(FlagListenAddr, c.ListenAddr, false)
	if !listenCanReceive(c.ListenAddr, c.ConnectAddr) {
		bad(FlagListenAddr, c.ListenAddr, "cannot receive a redirected "+c.ConnectAddr+"; listen on an address of the same family, or on [::] for both")
	}
	if c.Timeout <= 0 {
		bad(FlagTimeout, c.Timeout.String(), "must be positive")
	}
	if err := logging.CheckFormat(c.LogFormat); err != nil {
		bad(FlagLogFormat, c.LogFormat, err.Error())
	}
	if _, err := logging.ParseFilter(c.LogLevel, Target); err != nil {
		bad(FlagLogLevel, c.LogLevel, err.Error())
	}
	if c.IPv6 {
		addr(FlagIPv6ConnectAddr, c.IPv6ConnectAddr, true)
		if c.IPv6ListenAddr != "" {
			addr(FlagIPv6ListenAddr, c.IPv6ListenAddr, true)
		}
	}
	switch {
	case c.ProxyUID == 0:
		// Root is never exempt in proxy-init either (it refuses --proxy-uid 0).
		bad(FlagProxyUID, "0", "root cannot be the proxy UID; want -1 (skip) or a positive UID")
	case c.ProxyUID < -1 || c.ProxyUID > iptables.MaxID:
		bad(FlagProxyUID, fmt.Sprint(c.ProxyUID), fmt.Sprintf("want -1 (skip) or a UID from 1 to %d", iptables.MaxID))
	}
	if len(probs) > 0 {
		return &badinput.UsageError{Input: &badinput.Error{What: "invalid input", Problems: probs}}
	}
	return nil
}

// listenCanReceive reports whether a listener on listen can accept a redirected connection to
// connect: the same family, or [::]. Unparsable addresses are reported elsewhere.
func listenCanReceive(listen, connect string) bool {
	l, err1 := netip.ParseAddrPort(listen)
	c, err2 := netip.ParseAddrPort(connect)
	if err1 != nil || err2 != nil {
		return true
	}
	la, ca := l.Addr().Unmap(), c.Addr().Unmap()
	return la.Is4() == ca.Is4() || (la.Is6() && la.IsUnspecified())
}
