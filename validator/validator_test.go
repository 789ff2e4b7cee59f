package validator

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/internal/badinput"
)

func TestParse(t *testing.T) {
	def := DefaultConfig()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    func(c *Config)
		wantErr []string // substrings of the usage error, all reported at once
	}{
		{name: "defaults", args: nil, want: func(*Config) {}},
		{
			name: "linkerd chart ipv4",
			args: []string{"--log-format", "plain", "--log-level", "info", "--connect-addr", "1.1.1.1:20001", "--listen-addr", "0.0.0.0:4140", "--timeout", "10s"},
			want: func(c *Config) { c.ConnectAddr = "1.1.1.1:20001" },
		},
		{
			name: "linkerd chart ipv6",
			args: []string{"--log-format", "json", "--log-level", "debug", "--connect-addr", "[fd00::1]:20001", "--listen-addr", "[::]:4140", "--timeout", "10s"},
			want: func(c *Config) {
				c.LogFormat, c.LogLevel, c.ConnectAddr, c.ListenAddr = "json", "debug", "[fd00::1]:20001", "[::]:4140"
			},
		},
		{
			name: "our extra flags",
			args: []string{"--ipv6", "--ipv6-connect-addr", "[2001:db8::1]:9", "--ipv6-listen-addr", "[::1]:4140", "--proxy-uid", "2102"},
			want: func(c *Config) {
				c.IPv6, c.IPv6ConnectAddr, c.IPv6ListenAddr, c.ProxyUID = true, "[2001:db8::1]:9", "[::1]:4140", 2102
			},
		},
		{
			name: "every problem at once",
			args: []string{"--connect-addr", "example.com:80", "--listen-addr", "0.0.0.0:0", "--timeout", "0s", "--log-format", "xml", "--log-level", "loud", "--proxy-uid", "0"},
			wantErr: []string{
				`--connect-addr "example.com:80": want an IP address and port`,
				`--listen-addr "0.0.0.0:0": port 0`,
				`--timeout "0s": must be positive`,
				`--log-format "xml": unknown log format`,
				`--log-level "loud": unknown log level`,
				`--proxy-uid "0": root cannot be the proxy UID`,
			},
		},
		{
			name:    "ipv6 connect with an ipv4 listener",
			args:    []string{"--connect-addr", "[2001:db8::1]:20001"},
			wantErr: []string{`--listen-addr "0.0.0.0:4140": cannot receive a redirected [2001:db8::1]:20001`},
		},
		{
			name:    "ipv6 flags must be ipv6",
			args:    []string{"--ipv6", "--ipv6-connect-addr", "192.0.2.1:20001", "--ipv6-listen-addr", "[::ffff:192.0.2.1]:4140"},
			wantErr: []string{`--ipv6-connect-addr "192.0.2.1:20001": not an IPv6 address`, `--ipv6-listen-addr "[::ffff:192.0.2.1]:4140": not an IPv6 address`},
		},
		{
			name: "a filter, from Linkerd's variables",
			env:  map[string]string{EnvLogLevel: "linkerd_network_validator=debug,warn", EnvLogFormat: "json"},
			want: func(c *Config) { c.LogLevel, c.LogFormat = "linkerd_network_validator=debug,warn", "json" },
		},
		{
			name: "flags win over the variables",
			args: []string{"--log-level", "warn"},
			env:  map[string]string{EnvLogLevel: "debug"},
			want: func(c *Config) { c.LogLevel = "warn" },
		},
		{name: "bad filter", args: []string{"--log-level", "x{y}=info"}, wantErr: []string{`--log-level "x{y}=info": span and field filters are not supported`}},
		{name: "negative uid", args: []string{"--proxy-uid", "-2"}, wantErr: []string{`--proxy-uid "-2": want -1`}},
		{name: "uid 2^32 would be root", args: []string{"--proxy-uid", "4294967296"}, wantErr: []string{`--proxy-uid "4294967296": want -1 (skip) or a UID from 1 to 4294967294`}},
		{name: "unknown flag", args: []string{"--incoming-proxy-port", "4143"}, wantErr: []string{"unknown flag: --incoming-proxy-port"}},
		{name: "stray argument", args: []string{"now"}, wantErr: []string{`unexpected arguments ["now"]`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEnv(tc.args, func(k string) string { return tc.env[k] })
			if tc.wantErr != nil {
				var u *badinput.UsageError
				if !errors.As(err, &u) {
					t.Fatalf("Parse error = %v, want a *badinput.UsageError", err)
				}
				if ExitCode(err) != ExitUsage {
					t.Errorf("ExitCode = %d, want %d", ExitCode(err), ExitUsage)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error\n%s\nlacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			want := def
			tc.want(&want)
			if got != want {
				t.Fatalf("Parse = %+v\nwant    %+v", got, want)
			}
		})
	}
	if _, err := Parse([]string{"--help"}); !errors.Is(err, ErrHelp) {
		t.Errorf("Parse(--help) = %v, want ErrHelp", err)
	}
}

func TestUsageNamesEveryFlag(t *testing.T) {
	u := Usage()
	for _, f := range []string{FlagConnectAddr, FlagListenAddr, FlagTimeout, FlagLogFormat, FlagLogLevel, FlagIPv6, FlagIPv6ConnectAddr, FlagIPv6ListenAddr, FlagProxyUID} {
		if !strings.Contains(u, "--"+f) {
			t.Errorf("usage lacks --%s:\n%s", f, u)
		}
	}
	if !strings.Contains(u, "95") {
		t.Errorf("usage does not document exit code 95:\n%s", u)
	}
}

func TestChecks(t *testing.T) {
	tests := []struct {
		name string
		mod  func(c *Config)
		want []string // "name connect listen"
	}{
		{name: "default", mod: func(*Config) {}, want: []string{"ipv4 192.0.2.2:1404 0.0.0.0:4140"}},
		{
			name: "ipv6 derives its listener from the listen port",
			mod:  func(c *Config) { c.IPv6, c.ListenAddr = true, "0.0.0.0:5140" },
			want: []string{"ipv4 192.0.2.2:1404 0.0.0.0:5140", "ipv6 [fd00::1]:20001 [::]:5140"},
		},
		{
			name: "explicit ipv6 listener",
			mod:  func(c *Config) { c.IPv6, c.IPv6ListenAddr = true, "[::1]:4140" },
			want: []string{"ipv4 192.0.2.2:1404 0.0.0.0:4140", "ipv6 [fd00::1]:20001 [::1]:4140"},
		},
		{
			name: "ipv6 connect addr is not checked twice",
			mod:  func(c *Config) { c.IPv6, c.ConnectAddr, c.ListenAddr = true, "[2001:db8::1]:20001", "[::]:4140" },
			want: []string{"ipv6 [2001:db8::1]:20001 [::]:4140"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, ck := range c.checks() {
				got = append(got, fmt.Sprintf("%s %s %s", ck.name, ck.connect, ck.listen))
			}
			if strings.Join(got, "|") != strings.Join(tc.want, "|") {
				t.Fatalf("checks = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	f := &Failure{Check: "ipv4", Reason: ReasonNotRedirected, Detail: "no connection arrived"}
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, ExitOK},
		{"failure", f, ExitRedirectFailed},
		{"wrapped joined failures", fmt.Errorf("ctx: %w", errors.Join(errors.New("x"), f)), ExitRedirectFailed},
		{"usage", &badinput.UsageError{Message: "bad"}, ExitUsage},
		{"other", errors.New("listen on 0.0.0.0:4140: address already in use"), ExitFailure},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ExitCode(tc.err); got != tc.want {
				t.Fatalf("ExitCode(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
	if got := f.Error(); got != "ipv4 check failed (not-redirected): no connection arrived" {
		t.Errorf("Failure.Error() = %q", got)
	}
}

// TestHopLimitOne checks that validator sockets carry TTL / hop limit 1, which is what keeps an
// unredirected SYN from ever reaching the connect address. Loopback only; no root needed.
func TestHopLimitOne(t *testing.T) {
	tests := []struct {
		network, listen string
		level, opt      int
	}{
		{"tcp4", "127.0.0.1:0", unix.IPPROTO_IP, unix.IP_TTL},
		{"tcp6", "[::1]:0", unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS},
	}
	for _, tc := range tests {
		t.Run(tc.network, func(t *testing.T) {
			ln, err := net.Listen(tc.network, tc.listen)
			if err != nil {
				t.Fatalf("listen on %s loopback: %v", tc.network, err)
			}
			defer ln.Close()
			d := net.Dialer{Control: hopLimitOne, Timeout: 2 * time.Second}
			c, err := d.Dial(tc.network, ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			raw, err := c.(*net.TCPConn).SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			var got int
			var gerr error
			if err := raw.Control(func(fd uintptr) { got, gerr = unix.GetsockoptInt(int(fd), tc.level, tc.opt) }); err != nil {
				t.Fatal(err)
			}
			if gerr != nil || got != 1 {
				t.Fatalf("hop limit = %d (%v), want 1", got, gerr)
			}
		})
	}
}
