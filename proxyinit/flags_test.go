package proxyinit

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

// chartArgs builds the Linkerd chart's command line (partials.proxy-init), optional parts included
// when non-empty, exactly as the chart renders them.
func chartArgs(extra ...string) []string {
	return append([]string{
		"--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102",
		"--inbound-ports-to-ignore", "4190,4191,4567,4568",
	}, extra...)
}

// cfg is the Config chartArgs describes: the chart's, without outbound ports to skip.
func cfg(mut func(*iptables.Config)) iptables.Config {
	c := iptablestest.ChartConfig()
	c.OutboundPortsToIgnore = nil
	if mut != nil {
		mut(&c)
	}
	return c
}

func TestParseLinkerdCommandLines(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		cmd        Command
		want       iptables.Config
		modeSource string
		check      func(t *testing.T, o *Options)
	}{
		{
			name: "chart defaults (legacy chart: no firewall flags)",
			args: chartArgs(), cmd: CommandApply, modeSource: "default",
			want: cfg(nil),
		},
		{
			name: "chart with iptablesMode nft, IPv6 off, GID, outbound ignores and every option",
			args: []string{"--firewall-bin-path", "iptables-nft", "--firewall-save-bin-path", "iptables-nft-save", "--ipv6=false",
				"--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102", "--proxy-gid", "2102",
				"--inbound-ports-to-ignore", "4190,4191,4567,4568,25,587", "--outbound-ports-to-ignore", "4567,4568,3306",
				"--timeout-close-wait-secs", "3600", "--log-format", "json", "--log-level", "debug",
				"--subnets-to-ignore", "10.0.0.0/8, 2001:db8::/32"},
			cmd: CommandApply, modeSource: "--firewall-bin-path",
			want: cfg(func(c *iptables.Config) {
				c.ProxyGID = 2102
				c.InboundPortsToIgnore = []string{"4190,4191,4567,4568,25,587"}
				c.OutboundPortsToIgnore = []string{"4567,4568,3306"}
				c.InboundSubnetsToIgnore = []string{"10.0.0.0/8, 2001:db8::/32"}
				c.IPv6 = false
				c.Mode = iptables.ModeNFT
				c.CloseWaitSecs = 3600
			}),
			check: func(t *testing.T, o *Options) {
				if o.Config.CloseWaitSecs != 3600 || o.LogFormat != "json" || o.LogLevel != slog.LevelDebug {
					t.Errorf("close-wait %d, log format %q, level %v; want 3600, json, debug", o.Config.CloseWaitSecs, o.LogFormat, o.LogLevel)
				}
			},
		},
		{
			name: "control-plane pods",
			args: chartArgs("--outbound-ports-to-ignore", "443,6443"), cmd: CommandApply, modeSource: "default",
			want: cfg(func(c *iptables.Config) { c.OutboundPortsToIgnore = []string{"443,6443"} }),
		},
		{
			name: "control-plane pods on the nft chart",
			args: append([]string{"--firewall-bin-path", "iptables-nft", "--firewall-save-bin-path", "iptables-nft-save"},
				chartArgs("--outbound-ports-to-ignore", "443,6443")...),
			cmd: CommandApply, modeSource: "--firewall-bin-path",
			want: cfg(func(c *iptables.Config) {
				c.OutboundPortsToIgnore = []string{"443,6443"}
				c.Mode = iptables.ModeNFT
			}),
		},
		{
			name: "shorthands, repeated lists and redirect-listed ports",
			args: []string{"-p", "4143", "-o4140", "-u", "2102", "-g", "2103", "-r", "80,81", "-r", "8080-8090", "-w",
				"--inbound-ports-to-ignore", "4190", "--inbound-ports-to-ignore", "4191"},
			cmd: CommandApply, modeSource: "default",
			want: cfg(func(c *iptables.Config) {
				c.ProxyGID = 2103
				c.PortsToRedirect = []string{"80,81", "8080-8090"}
				c.InboundPortsToIgnore = []string{"4190", "4191"}
			}),
			check: func(t *testing.T, o *Options) {
				if !o.UseWaitFlag {
					t.Error("-w did not set UseWaitFlag")
				}
			},
		},
		{
			name: "subcommand put first: show",
			args: append([]string{"show"}, chartArgs("--output", "json")...), cmd: CommandShow, modeSource: "default",
			want: cfg(nil),
		},
		{
			name: "subcommand put first: cleanup",
			args: append([]string{"cleanup"}, chartArgs()...), cmd: CommandCleanup, modeSource: "default",
			want: cfg(nil),
		},
		{
			name: "cleanup needs no ports",
			args: []string{"cleanup", "--netns", "/proc/self/ns/net"}, cmd: CommandCleanup, modeSource: "default",
			want: iptables.NewConfig(),
		},
		{
			name: "version accepts the apply flags",
			args: append([]string{"version"}, chartArgs()...), cmd: CommandVersion, modeSource: "default",
			want: cfg(nil),
		},
		{
			name: "explicit --iptables-mode wins over the firewall paths, as in Linkerd",
			args: chartArgs("--iptables-mode", "legacy", "--firewall-bin-path", "iptables-nft", "--firewall-save-bin-path", "iptables-nft-save"),
			cmd:  CommandApply, modeSource: "--iptables-mode",
			want: cfg(func(c *iptables.Config) { c.Mode = iptables.ModeLegacy }),
			check: func(t *testing.T, o *Options) {
				if len(o.Warnings) != 1 || !strings.Contains(o.Warnings[0], "ignored") {
					t.Errorf("warnings %q, want one saying the firewall paths are ignored", o.Warnings)
				}
			},
		},
		{
			name: "Linkerd's old /sbin/iptables default selects plain",
			args: chartArgs("--firewall-bin-path", "/sbin/iptables", "--firewall-save-bin-path", "/sbin/iptables-save"),
			cmd:  CommandApply, modeSource: "--firewall-bin-path",
			want: cfg(func(c *iptables.Config) { c.Mode = iptables.ModePlain }),
		},
		{
			name: "save path alone selects the mode",
			args: chartArgs("--firewall-save-bin-path", "/usr/sbin/iptables-legacy-save"),
			cmd:  CommandApply, modeSource: "--firewall-save-bin-path",
			want: cfg(func(c *iptables.Config) { c.Mode = iptables.ModeLegacy }),
		},
		{
			name: "native nftables and outbound subnets via the alias",
			args: chartArgs("--iptables-mode=nftables", "--inbound-subnets-to-ignore", "192.0.2.0/24",
				"--outbound-subnets-to-ignore", "198.51.100.0/24,2001:db8:1::/64", "--simulate"),
			cmd: CommandApply, modeSource: "--iptables-mode",
			want: cfg(func(c *iptables.Config) {
				c.Mode = iptables.ModeNFTables
				c.InboundSubnetsToIgnore = []string{"192.0.2.0/24"}
				c.OutboundSubnetsToIgnore = []string{"198.51.100.0/24,2001:db8:1::/64"}
			}),
			check: func(t *testing.T, o *Options) {
				if !o.Simulate {
					t.Error("--simulate not set")
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, err := Parse(tt.args)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tt.args, err)
			}
			if o.Command != tt.cmd {
				t.Errorf("command %q, want %q", o.Command, tt.cmd)
			}
			if !reflect.DeepEqual(o.Config, tt.want) {
				t.Errorf("config\n got %+v\nwant %+v", o.Config, tt.want)
			}
			if o.ModeSource != tt.modeSource {
				t.Errorf("mode source %q, want %q", o.ModeSource, tt.modeSource)
			}
			if tt.check != nil {
				tt.check(t, o)
			}
		})
	}
}

// TestBadInput runs Main, so it checks both the message and the exit code; none of these reach
// a namespace or a backend, which is what makes "nothing is written" hold (the binary tests
// check that against a real namespace too).
func TestBadInput(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // the whole of stderr
	}{
		{"proxy port out of range", []string{"-p", "0", "-o", "65536"},
			"proxy-init: invalid input:\n  --incoming-proxy-port \"0\": port is outside 1-65535\n  --outgoing-proxy-port \"65536\": port is outside 1-65535\n"},
		{"proxy ports unset", []string{"--proxy-uid", "2102"},
			"proxy-init: invalid input:\n  --incoming-proxy-port \"-1\": must be set\n  --outgoing-proxy-port \"-1\": must be set\n"},
		{"not a number", chartArgs("--proxy-gid", "wheel"),
			"proxy-init: invalid input:\n  --proxy-gid \"wheel\": not an integer\n"},
		{"uid 0", []string{"-p", "4143", "-o", "4140", "-u", "0"},
			"proxy-init: invalid input:\n  --proxy-uid \"0\": refusing to exempt UID 0 (root): use -1 for no exemption\n"},
		{"gid 0", chartArgs("-g", "0"),
			"proxy-init: invalid input:\n  --proxy-gid \"0\": refusing to exempt GID 0 (root): use -1 for no exemption\n"},
		{"ignored port out of range, reversed and malformed ranges", chartArgs("--outbound-ports-to-ignore", "443,70000,9000-8000,1-x"),
			"proxy-init: invalid input:\n" +
				"  --outbound-ports-to-ignore \"70000\": port 70000 is outside 1-65535\n" +
				"  --outbound-ports-to-ignore \"9000-8000\": range 9000-8000 is reversed\n" +
				"  --outbound-ports-to-ignore \"1-x\": \"x\" is not a port number\n"},
		{"redirect port", chartArgs("-r", "80,0"),
			"proxy-init: invalid input:\n  --ports-to-redirect \"0\": port 0 is outside 1-65535\n"},
		{"bad CIDR", chartArgs("--subnets-to-ignore", "10.0.0.0/8,10.0.0.0/33"),
			"proxy-init: invalid input:\n  --subnets-to-ignore \"10.0.0.0/33\": \"10.0.0.0/33\" is not a valid CIDR\n"},
		{"bad CIDR named by the alias typed", chartArgs("--inbound-subnets-to-ignore", "nonsense"),
			"proxy-init: invalid input:\n  --inbound-subnets-to-ignore \"nonsense\": \"nonsense\" is not a CIDR or an IP address\n"},
		{"bad outbound CIDR", chartArgs("--outbound-subnets-to-ignore", "2001:db8::/129"),
			"proxy-init: invalid input:\n  --outbound-subnets-to-ignore \"2001:db8::/129\": \"2001:db8::/129\" is not a valid CIDR\n"},
		{"unknown mode", chartArgs("--iptables-mode", "ebpf"),
			"proxy-init: invalid input:\n  --iptables-mode \"ebpf\": unknown mode; want one of auto, legacy, nft, plain, nftables\n"},
		{"inconsistent firewall pair", chartArgs("--firewall-bin-path", "iptables-nft", "--firewall-save-bin-path", "iptables-legacy-save"),
			"proxy-init: invalid input:\n  --firewall-save-bin-path \"iptables-legacy-save\": selects mode legacy but --firewall-bin-path \"iptables-nft\" selects mode nft\n"},
		{"unknown firewall binaries", chartArgs("--firewall-bin-path", "/usr/sbin/nft", "--firewall-save-bin-path", "/usr/sbin/ebtables-save"),
			"proxy-init: invalid input:\n" +
				"  --firewall-bin-path \"/usr/sbin/nft\": cannot tell the iptables mode from it; want a path ending in iptables, iptables-legacy or iptables-nft (or use --iptables-mode)\n" +
				"  --firewall-save-bin-path \"/usr/sbin/ebtables-save\": cannot tell the iptables mode from it; want a path ending in iptables-save, iptables-legacy-save or iptables-nft-save (or use --iptables-mode)\n"},
		{"bad log settings, bool and close-wait", chartArgs("--log-format", "xml", "--log-level", "loud", "--ipv6=maybe", "--timeout-close-wait-secs", "-5"),
			"proxy-init: invalid input:\n" +
				"  --timeout-close-wait-secs \"-5\": must be 0 (leave the kernel's) or 1 to 2147483 seconds, the most every kernel accepts\n" +
				"  --log-format \"xml\": unknown log format; want plain or json\n" +
				"  --log-level \"loud\": unknown log level; want trace, debug, info, warn or error\n" +
				"  --ipv6 \"maybe\": not a boolean or auto (want true, false or auto)\n"},
		{"missing netns", chartArgs("--netns", "/run/netns/does-not-exist-proxyinit-test"),
			"proxy-init: invalid input:\n  --netns \"/run/netns/does-not-exist-proxyinit-test\": cannot use it as a network namespace: no such file or directory\n"},
		{"netns at a file", chartArgs("--netns", "/etc/hostname"),
			"proxy-init: invalid input:\n  --netns \"/etc/hostname\": cannot use it as a network namespace: a file, not a namespace (a namespace is /proc/PID/ns/net or a bind mount of it, e.g. under /run/netns)\n"},
		{"netns at a directory", chartArgs("--netns", "/proc/self/ns"),
			"proxy-init: invalid input:\n  --netns \"/proc/self/ns\": cannot use it as a network namespace: a directory, not a namespace (a namespace is /proc/PID/ns/net or a bind mount of it, e.g. under /run/netns)\n"},
		{"netns at another namespace type", chartArgs("--netns", "/proc/self/ns/mnt"),
			"proxy-init: invalid input:\n  --netns \"/proc/self/ns/mnt\": cannot use it as a network namespace: a mount namespace, not a network namespace\n"},
		{"IDs past 2^32-2 (2^32 would exempt root) and a close-wait past the kernel's limit",
			[]string{"-p", "4143", "-o", "4140", "-u", "4294967296", "-g", "4294967295", "--timeout-close-wait-secs", "18446744074"},
			"proxy-init: invalid input:\n" +
				"  --proxy-uid \"4294967296\": must be -1 (none) or a UID from 1 to 4294967294\n" +
				"  --proxy-gid \"4294967295\": must be -1 (none) or a GID from 1 to 4294967294\n" +
				"  --timeout-close-wait-secs \"18446744074\": must be 0 (leave the kernel's) or 1 to 2147483 seconds, the most every kernel accepts\n"},
		{"negative port", chartArgs("--outbound-ports-to-ignore", "-5"),
			"proxy-init: invalid input:\n  --outbound-ports-to-ignore \"-5\": \"-5\" is not a port number or a range a-b\n"},
		{"cleanup still refuses bad values", []string{"cleanup", "-p", "99999", "--iptables-mode", "x"},
			"proxy-init: invalid input:\n  --incoming-proxy-port \"99999\": port is outside 1-65535\n  --iptables-mode \"x\": unknown mode; want one of auto, legacy, nft, plain, nftables\n"},
		{"show output format", append([]string{"show"}, chartArgs("--output", "yaml")...),
			"proxy-init: invalid input:\n  --output \"yaml\": unknown output format; want text or json\n"},
		{"every problem at once", []string{"-p", "x", "-o", "4140", "-u", "0", "--inbound-ports-to-ignore", "0", "--subnets-to-ignore", "1.2.3.4/40", "--iptables-mode", "y"},
			"proxy-init: invalid input:\n" +
				"  --incoming-proxy-port \"x\": not an integer\n" +
				"  --proxy-uid \"0\": refusing to exempt UID 0 (root): use -1 for no exemption\n" +
				"  --inbound-ports-to-ignore \"0\": port 0 is outside 1-65535\n" +
				"  --subnets-to-ignore \"1.2.3.4/40\": \"1.2.3.4/40\" is not a valid CIDR\n" +
				"  --iptables-mode \"y\": unknown mode; want one of auto, legacy, nft, plain, nftables\n"},
		// The features beyond Linkerd's.
		{"DNS port out of range, and the proxy's own", chartArgs("--redirect-dns-to-port", "70000"),
			"proxy-init: invalid input:\n  --redirect-dns-to-port \"70000\": port is outside 1-65535 (0: capture no DNS)\n"},
		{"DNS port that is a proxy port", chartArgs("--redirect-dns-to-port", "4140"),
			"proxy-init: invalid input:\n  --redirect-dns-to-port \"4140\": is one of the proxy's TCP ports; DNS over TCP would reach that listener\n"},
		{"DNS servers only without DNS capture", chartArgs("--dns-servers-only"),
			"proxy-init: invalid input:\n  --dns-servers-only \"true\": needs --redirect-dns-to-port: it limits DNS capture, which is off\n"},
		{"unknown inbound mode", chartArgs("--inbound-mode", "tproxy6"),
			"proxy-init: invalid input:\n  --inbound-mode \"tproxy6\": unknown inbound mode; want redirect or tproxy\n"},
		{"outbound include lists", chartArgs("--outbound-ports-to-redirect", "80,0,99999", "--outbound-subnets-to-redirect", "10.0.0.0/33,fe80::1%eth0"),
			"proxy-init: invalid input:\n" +
				"  --outbound-ports-to-redirect \"0\": port 0 is outside 1-65535\n" +
				"  --outbound-ports-to-redirect \"99999\": port 99999 is outside 1-65535\n" +
				"  --outbound-subnets-to-redirect \"10.0.0.0/33\": \"10.0.0.0/33\" is not a valid CIDR\n" +
				"  --outbound-subnets-to-redirect \"fe80::1%eth0\": \"fe80::1%eth0\" has a zone, which a subnet cannot have\n"},
		{"interface names the kernel refuses or iptables cannot match", chartArgs("--interfaces-to-ignore", "eth0/1,a-very-long-name0,..,net+",
			"--interfaces-to-ignore", "eth 1", "--interfaces-to-ignore", `bad"quote`),
			"proxy-init: invalid input:\n" +
				"  --interfaces-to-ignore \"eth0/1\": holds '/', which the kernel refuses in an interface name\n" +
				"  --interfaces-to-ignore \"a-very-long-name0\": longer than 15 bytes, the kernel's limit for an interface name\n" +
				"  --interfaces-to-ignore \"..\": not a valid interface name\n" +
				"  --interfaces-to-ignore \"net+\": a trailing '+' is iptables' wildcard; name each interface in full\n" +
				"  --interfaces-to-ignore \"eth 1\": holds ' ', which the kernel refuses in an interface name\n" +
				"  --interfaces-to-ignore \"bad\\\"quote\": holds '\"', which iptables cannot match in an interface name\n"},
		{"virtual machine interfaces: bad names, loopback, an ignored one", chartArgs("--reroute-virtual-interfaces", "tap0,eth0/1", "--interfaces-to-ignore", "net1",
			"--reroute-virtual-interfaces", "lo,net1", "--reroute-virtual-interfaces", "k6t-eth0-too-long"),
			"proxy-init: invalid input:\n" +
				"  --reroute-virtual-interfaces \"eth0/1\": holds '/', which the kernel refuses in an interface name\n" +
				"  --reroute-virtual-interfaces \"k6t-eth0-too-long\": longer than 15 bytes, the kernel's limit for an interface name\n" +
				"  --reroute-virtual-interfaces \"lo\": the pod's own traffic, the proxy's included, arrives on it, not a virtual machine's\n" +
				"  --reroute-virtual-interfaces \"net1\": also in interfaces-to-ignore: its traffic cannot both skip the proxy and reach it\n"},
		{"UIDs and GIDs to ignore past 2^32-2, root, negative, not numbers", chartArgs("--uids-to-ignore", "1000,4294967295,0", "--gids-to-ignore", "-3,wheel"),
			"proxy-init: invalid input:\n" +
				"  --uids-to-ignore \"4294967295\": must be a UID from 1 to 4294967294\n" +
				"  --uids-to-ignore \"0\": refusing to exempt UID 0 (root)\n" +
				"  --gids-to-ignore \"-3\": must be a GID from 1 to 4294967294\n" +
				"  --gids-to-ignore \"wheel\": not a GID (an integer)\n"},
		{"the docs' example", []string{"-p", "4143", "-o", "4140", "--redirect-dns-to-port", "65536", "--interfaces-to-ignore", "net1,eth0:1", "--uids-to-ignore", "4294967295"},
			"proxy-init: invalid input:\n" +
				"  --redirect-dns-to-port \"65536\": port is outside 1-65535 (0: capture no DNS)\n" +
				"  --interfaces-to-ignore \"eth0:1\": holds ':', which the kernel refuses in an interface name\n" +
				"  --uids-to-ignore \"4294967295\": must be a UID from 1 to 4294967294\n"},
		{"boolean features", chartArgs("--drop-invalid=sometimes", "--ipv6=automatic"),
			"proxy-init: invalid input:\n" +
				"  --ipv6 \"automatic\": not a boolean or auto (want true, false or auto)\n" +
				"  --drop-invalid \"sometimes\": not a boolean (want true or false)\n"},
		{"unknown flag", chartArgs("--proxy-port", "1"),
			"proxy-init: unknown flag: --proxy-port (see proxy-init --help)\n"},
		{"missing value", []string{"-p"},
			"proxy-init: flag needs an argument: 'p' in -p (see proxy-init --help)\n"},
		{"unknown subcommand", append([]string{"status"}, chartArgs()...),
			"proxy-init: unknown command \"status\"; want one of cleanup, show, version (see proxy-init --help)\n"},
		{"two subcommands", []string{"show", "cleanup"},
			"proxy-init: unexpected arguments [\"show\" \"cleanup\"]: proxy-init takes at most one subcommand (see proxy-init --help)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), tt.args, &stdout, &stderr)
			if code != ExitUsage {
				t.Errorf("exit code %d, want %d", code, ExitUsage)
			}
			if got := stderr.String(); got != tt.want {
				t.Errorf("stderr\n got %q\nwant %q", got, tt.want)
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout not empty: %q", stdout.String())
			}
			_, err := Parse(tt.args)
			var uerr *badinput.UsageError
			if !errors.As(err, &uerr) {
				t.Errorf("Parse error %v is not a *badinput.UsageError", err)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"show", "--help"}, {"help"}} {
		var stdout, stderr bytes.Buffer
		if code := Main(context.Background(), args, &stdout, &stderr); code != ExitOK {
			t.Errorf("%q: exit %d, want 0 (stderr %q)", args, code, stderr.String())
		}
		for _, want := range []string{"-p, --incoming-proxy-port", "-r, --ports-to-redirect", "-w, --use-wait-flag",
			"--inbound-subnets-to-ignore", "--iptables-mode string", `(default "auto")`, "Exit codes"} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("%q: help lacks %q", args, want)
			}
		}
	}
}

// TestDefaults pins the defaults of the flag table in docs/linkerd-compatibility.md.
func TestDefaults(t *testing.T) {
	fs, _ := newFlagSet()
	want := map[string][2]string{ // name -> shorthand, default
		"incoming-proxy-port": {"p", "-1"}, "outgoing-proxy-port": {"o", "-1"}, "proxy-uid": {"u", "-1"}, "proxy-gid": {"g", "-1"},
		"ports-to-redirect": {"r", ""}, "inbound-ports-to-ignore": {"", ""}, "outbound-ports-to-ignore": {"", ""},
		"subnets-to-ignore": {"", ""}, "inbound-subnets-to-ignore": {"", ""}, "outbound-subnets-to-ignore": {"", ""},
		"simulate": {"", "false"}, "netns": {"", ""}, "use-wait-flag": {"w", "false"}, "timeout-close-wait-secs": {"", "0"},
		"log-format": {"", "plain"}, "log-level": {"", "info"}, "iptables-mode": {"", "auto"}, "ipv6": {"", "true"},
		"firewall-bin-path": {"", ""}, "firewall-save-bin-path": {"", ""}, "output": {"", "text"},
		// The features beyond Linkerd's (docs/proxy-init.md).
		"redirect-dns-to-port": {"", "0"}, "dns-servers-only": {"", "false"}, "inbound-mode": {"", "redirect"},
		"outbound-ports-to-redirect": {"", ""}, "outbound-subnets-to-redirect": {"", ""}, "interfaces-to-ignore": {"", ""},
		"uids-to-ignore": {"", ""}, "gids-to-ignore": {"", ""}, "drop-invalid": {"", "false"}, "reroute-virtual-interfaces": {"", ""},
	}
	for name, w := range want {
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("flag --%s missing", name)
			continue
		}
		if f.Shorthand != w[0] || f.DefValue != w[1] {
			t.Errorf("--%s: shorthand %q default %q, want %q %q", name, f.Shorthand, f.DefValue, w[0], w[1])
		}
	}
	n := 0
	fs.VisitAll(func(*pflag.Flag) { n++ })
	if n != len(want) {
		t.Errorf("%d flags defined, want %d: update this table, docs/proxy-init.md and docs/linkerd-compatibility.md", n, len(want))
	}
}

// The flags of the features beyond Linkerd's, each into its Config field; --ipv6 keeps Linkerd's
// boolean forms beside auto.
func TestParseFeatureFlags(t *testing.T) {
	dir := t.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("search svc.cluster.local\nnameserver 192.0.2.53\n# nameserver 192.0.2.99\nnameserver fe80::53%eth0\noptions ndots:5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	old := resolvConf
	resolvConf = resolv
	t.Cleanup(func() { resolvConf = old })

	o, err := Parse(chartArgs("--redirect-dns-to-port", "5353", "--dns-servers-only", "--inbound-mode", "tproxy",
		"--outbound-ports-to-redirect", "80,443", "--outbound-ports-to-redirect", "8000-8100", "--outbound-subnets-to-redirect", "10.0.0.0/8",
		"--interfaces-to-ignore", "net1,net2", "--uids-to-ignore", "1000", "--gids-to-ignore", "3000,3001", "--drop-invalid", "--ipv6=auto",
		"--reroute-virtual-interfaces", "tap0,k6t-eth0", "--reroute-virtual-interfaces", "tap1"))
	if err != nil {
		t.Fatal(err)
	}
	want := cfg(func(c *iptables.Config) {
		c.RedirectDNSToPort, c.DNSServersOnly, c.DNSServers = 5353, true, []string{"192.0.2.53", "fe80::53%eth0"}
		c.InboundMode = iptables.InboundTPROXY
		c.OutboundPortsToRedirect = []string{"80,443", "8000-8100"}
		c.OutboundSubnetsToRedirect = []string{"10.0.0.0/8"}
		c.InterfacesToIgnore = []string{"net1,net2"}
		c.UIDsToIgnore, c.GIDsToIgnore = []string{"1000"}, []string{"3000,3001"}
		c.DropInvalid, c.IPv6Auto = true, true
		c.RerouteVirtualInterfaces = []string{"tap0,k6t-eth0", "tap1"}
	})
	if !reflect.DeepEqual(o.Config, want) {
		t.Errorf("config\n got %+v\nwant %+v", o.Config, want)
	}
	if rs := o.rules; rs == nil || len(rs.DNSServers) != 2 || rs.DNSServers[1].String() != "fe80::53" {
		t.Errorf("nameservers in the rules: %+v (the zone dropped)", rs)
	}

	for _, c := range []struct {
		arg  string
		want iptables.Config
	}{
		{"--ipv6", cfg(nil)},
		{"--ipv6=true", cfg(nil)},
		{"--ipv6=false", cfg(func(c *iptables.Config) { c.IPv6 = false })},
		{"--ipv6=auto", cfg(func(c *iptables.Config) { c.IPv6Auto = true })},
	} {
		o, err := Parse(chartArgs(c.arg))
		if err != nil {
			t.Fatalf("%s: %v", c.arg, err)
		}
		if !reflect.DeepEqual(o.Config, c.want) {
			t.Errorf("%s: config\n got %+v\nwant %+v", c.arg, o.Config, c.want)
		}
	}
}

// --dns-servers-only reads /etc/resolv.conf; one it cannot read, or that names no nameserver, is
// refused before anything is written, exit 2.
func TestDNSServersOnlyResolvConf(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.conf")
	if err := os.WriteFile(empty, []byte("search example\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{filepath.Join(dir, "missing.conf"), "proxy-init: invalid input:\n  --dns-servers-only \"true\": cannot read the nameservers: open " + filepath.Join(dir, "missing.conf") + ": no such file or directory\n"},
		{empty, "proxy-init: invalid input:\n  --dns-servers-only \"true\": /etc/resolv.conf names no nameserver to limit DNS capture to\n"},
	} {
		old := resolvConf
		resolvConf = c.path
		var stdout, stderr bytes.Buffer
		code := Main(context.Background(), chartArgs("--redirect-dns-to-port", "5353", "--dns-servers-only"), &stdout, &stderr)
		resolvConf = old
		if code != ExitUsage || stderr.String() != c.want {
			t.Errorf("%s: exit %d, stderr\n got %q\nwant %q", c.path, code, stderr.String(), c.want)
		}
	}
}

// show without rule flags inspects, whatever the mode, output and log flags say; any rule flag
// makes it compare, which needs the proxy ports.
func TestShowInspectsWithoutRuleFlags(t *testing.T) {
	for _, c := range []struct {
		args    []string
		inspect bool
		err     string
	}{
		{[]string{"show"}, true, ""},
		{[]string{"show", "--iptables-mode", "legacy", "--output", "json", "--log-level", "debug", "-w"}, true, ""},
		{[]string{"show", "--firewall-bin-path", "iptables-nft"}, true, ""},
		{chartArgs("show"), false, ""},
		{[]string{"show", "--ipv6=false"}, false, "--incoming-proxy-port \"-1\": must be set"},
		{[]string{"show", "--iptables-mode", "ebpf"}, false, "--iptables-mode \"ebpf\": unknown mode"},
	} {
		o, err := Parse(c.args)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("Parse(%q) = %v, want an error with %q", c.args, err, c.err)
		case c.err == "" && err != nil:
			t.Errorf("Parse(%q): %v", c.args, err)
		case err == nil && o.Inspect != c.inspect:
			t.Errorf("Parse(%q).Inspect = %t, want %t", c.args, o.Inspect, c.inspect)
		}
	}
}
