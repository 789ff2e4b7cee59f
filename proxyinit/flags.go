package proxyinit

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/internal/logging"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
)

// Command is a proxy-init subcommand.
type Command string

const (
	// CommandApply writes the rules; it is what runs when no subcommand is given.
	CommandApply Command = "apply"
	// CommandCleanup removes our chains and the jumps to them, and nothing else.
	CommandCleanup Command = "cleanup"
	// CommandShow prints the rules in place and whether they match the flags.
	CommandShow Command = "show"
	// CommandVersion prints build information.
	CommandVersion Command = "version"
)

// commands are the subcommands that take proxy-init's flags, anywhere on the line. Not "validate",
// which Main dispatches first, with its own flags; not "apply", which Linkerd users never name.
var commands = []string{string(CommandCleanup), string(CommandShow), string(CommandVersion)}

// Flag names beyond the iptables.Field* ones, which double as flag names.
const (
	flagInboundSubnetsAlias = "inbound-subnets-to-ignore"
	flagSimulate            = "simulate"
	flagNetNS               = "netns"
	flagUseWait             = "use-wait-flag"
	flagCloseWait           = "timeout-close-wait-secs"
	flagLogFormat           = "log-format"
	flagLogLevel            = "log-level"
	flagIPv6                = iptables.FieldIPv6
	flagFirewallBin         = "firewall-bin-path"
	flagFirewallSave        = "firewall-save-bin-path"
	flagOutput              = "output"
)

// Options is a parsed and validated command line.
type Options struct {
	Command Command
	// Config has passed Validate (but cleanup, which needs no ports, accepts them unset).
	Config iptables.Config
	// ModeSource says where Config.Mode came from: a flag ("--iptables-mode") or "default".
	ModeSource string
	Simulate   bool
	// NetNS is the path of the network namespace to work in; empty means the current one.
	NetNS       string
	UseWaitFlag bool
	LogFormat   string // "plain" or "json"
	LogLevel    slog.Level
	Output      string // "text" or "json": how show and version print
	// Inspect is set for show without rule flags: it tells the configuration the rules in place
	// were written from and whether they are whole.
	Inspect bool
	// Warnings are accepted but ignored inputs, logged once the logger exists.
	Warnings []string
	// rules is Config built while it was validated, so a thousand subnets are parsed once.
	rules *iptables.Ruleset
}

// ErrHelp is returned by Parse for -h and --help; Main prints Usage and exits 0.
var ErrHelp = pflag.ErrHelp

// flagValues holds the raw flag values, the lists in config. Ints and bools are kept as text, so a
// malformed number is one more reported problem instead of ending the parse.
type flagValues struct {
	config                                iptables.Config
	inPort, outPort, uid, gid, closeWait  *lenient[int]
	simulate, wait, ipv6                  *lenient[bool]
	netns, logFormat, logLevel, mode      string
	firewallBin, firewallSave, outputMode string
	// The features beyond Linkerd's.
	dnsPort                     *lenient[int]
	dnsServersOnly, dropInvalid *lenient[bool]
	inboundMode                 string
}

func newFlagSet() (*pflag.FlagSet, *flagValues) {
	fs := pflag.NewFlagSet("proxy-init", pflag.ContinueOnError)
	fs.SetOutput(io.Discard) // Main reports errors itself, once
	fs.SortFlags = false
	d := iptables.NewConfig()
	v := &flagValues{
		config: d, inPort: newInt(d.InboundProxyPort), outPort: newInt(d.OutboundProxyPort),
		uid: newInt(d.ProxyUID), gid: newInt(d.ProxyGID), closeWait: newInt(0),
		simulate: newBool(false), wait: newBool(false), ipv6: newBool(true),
		dnsPort: newInt(0), dnsServersOnly: newBool(false), dropInvalid: newBool(false),
	}
	c := &v.config
	list := func(dst *[]string, typ string) *rawList { return &rawList{values: dst, typ: typ} }
	inSubnets := list(&c.InboundSubnetsToIgnore, "cidrs")
	fs.VarP(v.inPort, iptables.FieldInboundProxyPort, "p", "port the proxy accepts inbound traffic on; inbound TCP is redirected here (required)")
	fs.VarP(v.outPort, iptables.FieldOutboundProxyPort, "o", "port the proxy accepts outbound traffic on; outbound TCP is redirected here (required)")
	fs.VarP(v.uid, iptables.FieldProxyUID, "u", "UID the proxy runs as; its outbound traffic is not redirected (-1: none; 0 is refused)")
	fs.VarP(v.gid, iptables.FieldProxyGID, "g", "GID the proxy runs as; its outbound traffic is not redirected (-1: none; 0 is refused)")
	fs.VarP(list(&c.PortsToRedirect, "ports"), iptables.FieldPortsToRedirect, "r", "redirect only these inbound ports and ranges (default: all); comma list, repeatable")
	fs.Var(list(&c.InboundPortsToIgnore, "ports"), iptables.FieldInboundPortsToIgnore, "inbound ports and ranges (a-b) that skip the proxy; comma list, repeatable")
	fs.Var(list(&c.OutboundPortsToIgnore, "ports"), iptables.FieldOutboundPortsToIgnore, "outbound ports and ranges (a-b) that skip the proxy; comma list, repeatable")
	fs.Var(inSubnets, iptables.FieldInboundSubnetsToIgnore, "inbound traffic from these source CIDRs skips the proxy; comma list, repeatable")
	fs.Var(inSubnets, flagInboundSubnetsAlias, "alias of --"+iptables.FieldInboundSubnetsToIgnore)
	fs.Var(list(&c.OutboundSubnetsToIgnore, "cidrs"), iptables.FieldOutboundSubnetsToIgnore, "outbound traffic to these destination CIDRs skips the proxy; comma list, repeatable")
	fs.Var(v.simulate, flagSimulate, "print what would be written and change nothing: the iptables-restore payloads (legacy, plain), the nf_tables batch for the namespace's current rules (nft, nftables), or each of auto's choices in turn")
	fs.StringVar(&v.netns, flagNetNS, "", "path of the network namespace to work in (e.g. /run/netns/pod), entered in-process")
	fs.VarP(v.wait, flagUseWait, "w", "wait for the xtables lock (bounded) instead of failing when it is held")
	fs.Var(v.closeWait, flagCloseWait, "set nf_conntrack_tcp_timeout_close_wait in the namespace to this many seconds (0: leave alone)")
	fs.StringVar(&v.logFormat, flagLogFormat, "plain", "log format: plain or json (logs go to stderr)")
	fs.StringVar(&v.logLevel, flagLogLevel, "info", "log level: trace, debug, info, warn, error")
	fs.StringVar(&v.mode, iptables.FieldMode, string(iptables.ModeAuto), "backend: auto, legacy, nft, plain or nftables. auto writes iptables-nft's rules over netlink when the kernel accepts them (shown by iptables -t nat -S), else the native nftables table, else iptables-legacy; nft writes iptables-nft's rules over netlink, else with the iptables-nft binaries")
	fs.Var(v.ipv6, flagIPv6, "also write IPv6 rules: true, false, or auto (only where the namespace has IPv6 enabled and an address other than loopback and link-local); write --ipv6=auto")
	fs.StringVar(&v.firewallBin, flagFirewallBin, "", "back-compat: iptables, iptables-legacy or iptables-nft selects the mode plain, legacy or nft")
	fs.StringVar(&v.firewallSave, flagFirewallSave, "", "back-compat: iptables-save, iptables-legacy-save or iptables-nft-save; must agree with --firewall-bin-path")
	fs.StringVar(&v.outputMode, flagOutput, "text", "show and version: print as text or json")

	// The features beyond Linkerd's.
	fs.Var(v.dnsPort, iptables.FieldRedirectDNS, "send the pod's DNS (UDP and TCP to port 53) to this port on loopback, but the exempt users' and groups' (0: capture none)")
	fs.Var(v.dnsServersOnly, iptables.FieldDNSServersOnly, "capture DNS only to the nameservers of /etc/resolv.conf (needs --"+iptables.FieldRedirectDNS+")")
	fs.StringVar(&v.inboundMode, iptables.FieldInboundMode, string(iptables.InboundRedirect), "how inbound TCP reaches the proxy: redirect (REDIRECT; the proxy asks for the original destination) or tproxy (TPROXY and a policy route; the proxy's transparent socket keeps it)")
	fs.Var(list(&c.OutboundPortsToRedirect, "ports"), iptables.FieldOutboundPortsToRedirect, "redirect only outbound TCP to these ports and ranges (default: all); comma list, repeatable")
	fs.Var(list(&c.OutboundSubnetsToRedirect, "cidrs"), iptables.FieldOutboundSubnetsToRedirect, "redirect only outbound TCP to these destination CIDRs (default: all); comma list, repeatable")
	fs.Var(list(&c.InterfacesToIgnore, "names"), iptables.FieldInterfacesToIgnore, "traffic in or out of these interfaces is never redirected; comma list, repeatable")
	fs.Var(list(&c.UIDsToIgnore, "uids"), iptables.FieldUIDsToIgnore, "more UIDs whose outbound traffic is not redirected, like --"+iptables.FieldProxyUID+"; comma list, repeatable")
	fs.Var(list(&c.GIDsToIgnore, "gids"), iptables.FieldGIDsToIgnore, "more GIDs whose outbound traffic is not redirected, like --"+iptables.FieldProxyGID+"; comma list, repeatable")
	fs.Var(v.dropInvalid, iptables.FieldDropInvalid, "drop inbound TCP that conntrack marks INVALID, instead of letting it reach the application unredirected")
	fs.Var(list(&c.RerouteVirtualInterfaces, "names"), iptables.FieldRerouteVirtualInterfaces, "a virtual machine's interfaces (KubeVirt's tap or bridge): TCP arriving on them is the VM's outbound traffic and goes to the outbound proxy port, with the outbound ignore lists; comma list, repeatable")
	return fs, v
}

// resolvConf is what --dns-servers-only reads: the pod's, where proxy-init is its init container.
var resolvConf = "/etc/resolv.conf"

// nameservers returns the nameserver addresses of a resolv.conf, as written.
func nameservers(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, l := range strings.Split(string(data), "\n") {
		f := strings.Fields(l)
		if len(f) >= 2 && f[0] == "nameserver" {
			out = append(out, f[1])
		}
	}
	return out, nil
}

// Usage is the help text.
func Usage() string {
	fs, _ := newFlagSet()
	return `proxy-init writes the netfilter rules that send a pod's TCP traffic through its sidecar proxy.

Usage:
  proxy-init [flags]            apply the rules (idempotent; a changed config replaces them atomically)
  proxy-init cleanup [flags]    remove our chains and jumps, and nothing else
  proxy-init show [flags]       print the rules in place and the command line that wrote them; exit 1
                                unless they are whole (given rule flags: unless they match them)
  proxy-init version            print build information
  proxy-init help               print this help (also -h, --help)
  proxy-init validate ...       the network validator, with its own flags (see proxy-init validate --help)

Every subcommand but validate accepts the same flags, so an apply command line works with a
subcommand put first.

Flags:
` + fs.FlagUsages() + `
Exit codes: 0 success, 1 failure, 2 bad usage or input (nothing is written).
`
}

// Parse turns a command line (without the program name) into validated Options, every problem at
// once in a *badinput.UsageError; -h or --help returns ErrHelp. It reads only the --netns path.
func Parse(args []string) (*Options, error) {
	fs, v := newFlagSet()
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, ErrHelp
		}
		return nil, &badinput.UsageError{Message: err.Error() + " (see proxy-init --help)"}
	}
	cmd, err := parseCommand(fs.Args())
	if err != nil {
		return nil, err
	}
	o := &Options{Command: cmd}
	p := &flagReader{badFields: map[string]bool{}}
	c := p.ruleConfig(fs, v)
	o.Simulate = valueOf(p, flagSimulate, v.simulate)
	o.UseWaitFlag = valueOf(p, flagUseWait, v.wait)
	c.CloseWaitSecs = int64(valueOf(p, flagCloseWait, v.closeWait))
	o.NetNS = v.netns

	c.Mode, o.ModeSource, o.Warnings = p.resolveMode(fs, v)
	p.output(o, v)
	o.Config = c

	if o.Command != CommandVersion {
		if o.NetNS != "" {
			if err := netnsutil.CheckNetNS(o.NetNS); err != nil {
				p.bad(flagNetNS, o.NetNS, "cannot use it as a network namespace: "+err.Error())
			}
		}
		o.Inspect = o.Command == CommandShow && !ruleFlagSet(fs)
		o.rules = p.configProblems(o, c, fs)
	}
	if probs := p.probs; len(probs) > 0 {
		sortByFlagOrder(fs, probs)
		for i := range probs {
			probs[i].Field = "--" + probs[i].Field
		}
		return nil, &badinput.UsageError{Input: &badinput.Error{What: "invalid input", Problems: probs}}
	}
	return o, nil
}

// parseCommand reads the positional arguments: none (apply), or one subcommand.
func parseCommand(pos []string) (Command, error) {
	switch len(pos) {
	case 0:
		return CommandApply, nil
	case 1:
		if pos[0] == "help" {
			return "", ErrHelp
		}
		if !slices.Contains(commands, pos[0]) {
			return "", &badinput.UsageError{Message: fmt.Sprintf("unknown command %q; want one of %s (see proxy-init --help)",
				pos[0], strings.Join(commands, ", "))}
		}
		return Command(pos[0]), nil
	}
	return "", &badinput.UsageError{Message: fmt.Sprintf("unexpected arguments %q: proxy-init takes at most one subcommand (see proxy-init --help)", pos)}
}

// flagReader reads the flags' lenient values into typed ones, collecting every problem.
type flagReader struct {
	probs     []badinput.Problem
	badFields map[string]bool // fields already reported, so Validate does not repeat them
}

func (p *flagReader) bad(field, value, reason string) {
	p.probs = append(p.probs, badinput.Problem{Field: field, Value: value, Reason: reason})
}

// valueOf converts f's text; a malformed one is reported once (Validate then skips it) as f.def.
func valueOf[T any](p *flagReader, name string, f *lenient[T]) T {
	v, err := f.parse(strings.TrimSpace(f.raw))
	if err != nil {
		p.bad(name, f.raw, f.notA)
		p.badFields[name] = true
		return f.def
	}
	return v
}

// ruleConfig is the rule configuration the flags give, but the close-wait timeout and the mode.
func (p *flagReader) ruleConfig(fs *pflag.FlagSet, v *flagValues) iptables.Config {
	c := v.config
	c.InboundProxyPort = valueOf(p, iptables.FieldInboundProxyPort, v.inPort)
	c.OutboundProxyPort = valueOf(p, iptables.FieldOutboundProxyPort, v.outPort)
	c.ProxyUID = valueOf(p, iptables.FieldProxyUID, v.uid)
	c.ProxyGID = valueOf(p, iptables.FieldProxyGID, v.gid)
	if strings.TrimSpace(v.ipv6.raw) == "auto" {
		c.IPv6Auto = true
	} else if b, err := strconv.ParseBool(strings.TrimSpace(v.ipv6.raw)); err != nil {
		p.bad(flagIPv6, v.ipv6.raw, "not a boolean or auto (want true, false or auto)")
	} else {
		c.IPv6 = b
	}
	c.RedirectDNSToPort = valueOf(p, iptables.FieldRedirectDNS, v.dnsPort)
	c.DNSServersOnly = valueOf(p, iptables.FieldDNSServersOnly, v.dnsServersOnly)
	if c.DNSServersOnly && c.RedirectDNSToPort > 0 {
		servers, err := nameservers(resolvConf)
		if err != nil {
			p.bad(iptables.FieldDNSServersOnly, "true", "cannot read the nameservers: "+err.Error())
			p.badFields[iptables.FieldDNSServersOnly] = true
		}
		c.DNSServers = servers
	}
	if fs.Changed(iptables.FieldInboundMode) {
		c.InboundMode = iptables.InboundMode(v.inboundMode)
	}
	c.DropInvalid = valueOf(p, iptables.FieldDropInvalid, v.dropInvalid)
	return c
}

// output reads the log format and level and the output format into o.
func (p *flagReader) output(o *Options, v *flagValues) {
	o.LogFormat = v.logFormat
	if err := logging.CheckFormat(v.logFormat); err != nil {
		p.bad(flagLogFormat, v.logFormat, err.Error())
	}
	lvl, err := logging.ParseLevel(v.logLevel)
	if err != nil {
		p.bad(flagLogLevel, v.logLevel, err.Error())
	}
	o.LogLevel = lvl
	o.Output = v.outputMode
	if v.outputMode != "text" && v.outputMode != "json" {
		p.bad(flagOutput, v.outputMode, "unknown output format; want text or json")
	}
}

// sortByFlagOrder lists problems in the order of the flags in --help.
func sortByFlagOrder(fs *pflag.FlagSet, probs []badinput.Problem) {
	order := map[string]int{}
	i := 0
	fs.VisitAll(func(f *pflag.Flag) { order[f.Name] = i; i++ })
	slices.SortStableFunc(probs, func(a, b badinput.Problem) int { return order[a.Field] - order[b.Field] })
}

// ruleFlagSet reports whether the command line sets a flag that configures the rules.
func ruleFlagSet(fs *pflag.FlagSet) bool {
	set := false
	fs.Visit(func(f *pflag.Flag) {
		switch f.Name {
		case flagSimulate, flagNetNS, flagUseWait, flagLogFormat, flagLogLevel, flagOutput, iptables.FieldMode, flagFirewallBin, flagFirewallSave:
		default:
			set = true
		}
	})
	return set
}

// configProblems validates the rule configuration and returns the rules when it is valid; cleanup
// and show without rule flags accept the ports unset, and the alias is named when typed.
func (r *flagReader) configProblems(o *Options, c iptables.Config, fs *pflag.FlagSet) *iptables.Ruleset {
	rs, err := iptables.Build(c)
	verr, ok := badinput.As(err)
	if !ok {
		return rs
	}
	for _, p := range verr.Problems {
		if r.badFields[p.Field] {
			continue
		}
		unsetPort := (p.Field == iptables.FieldInboundProxyPort || p.Field == iptables.FieldOutboundProxyPort) && p.Value == "-1"
		if (o.Command == CommandCleanup || o.Inspect) && unsetPort {
			continue
		}
		if p.Field == iptables.FieldInboundSubnetsToIgnore && fs.Changed(flagInboundSubnetsAlias) && !fs.Changed(iptables.FieldInboundSubnetsToIgnore) {
			p.Field = flagInboundSubnetsAlias
		}
		r.probs = append(r.probs, p)
	}
	return nil
}

// resolveMode picks the backend mode: --iptables-mode, which wins over the firewall paths as in
// Linkerd; else the paths' base names, for charts that still pass them; else auto.
func (p *flagReader) resolveMode(fs *pflag.FlagSet, v *flagValues) (iptables.Mode, string, []string) {
	binSet := v.firewallBin != ""
	saveSet := v.firewallSave != ""
	if fs.Changed(iptables.FieldMode) && v.mode != "" {
		var warnings []string
		if binSet || saveSet {
			warnings = append(warnings, fmt.Sprintf("--%s and --%s are ignored: --%s takes precedence", flagFirewallBin, flagFirewallSave, iptables.FieldMode))
		}
		// The value itself is checked by iptables.Config.Validate, under the same flag name.
		return iptables.Mode(v.mode), "--" + iptables.FieldMode, warnings
	}
	if !binSet && !saveSet {
		return iptables.ModeAuto, "default", nil
	}
	n := len(p.probs)
	binMode := p.modeFromBinary(flagFirewallBin, v.firewallBin, "")
	saveMode := p.modeFromBinary(flagFirewallSave, v.firewallSave, "-save")
	switch {
	case len(p.probs) > n:
		return iptables.ModeAuto, "", nil
	case binSet && saveSet && binMode != saveMode:
		p.bad(flagFirewallSave, v.firewallSave,
			fmt.Sprintf("selects mode %s but --%s %q selects mode %s", saveMode, flagFirewallBin, v.firewallBin, binMode))
		return iptables.ModeAuto, "", nil
	case binSet:
		return binMode, "--" + flagFirewallBin, nil
	default:
		return saveMode, "--" + flagFirewallSave, nil
	}
}

// modeFromBinary maps the path of a Linkerd firewall binary (iptables or, with suffix "-save",
// iptables-save) to a mode by its base name; one that names none, when set, is a problem.
func (p *flagReader) modeFromBinary(flag, path, suffix string) iptables.Mode {
	switch base := filepath.Base(strings.TrimSpace(path)); {
	case strings.HasPrefix(base, "iptables-legacy"):
		return iptables.ModeLegacy
	case strings.HasPrefix(base, "iptables-nft"):
		return iptables.ModeNFT
	case base == "iptables"+suffix:
		return iptables.ModePlain
	}
	if path != "" {
		p.bad(flag, path, fmt.Sprintf("cannot tell the iptables mode from it; want a path ending in "+
			"iptables%[1]s, iptables-legacy%[1]s or iptables-nft%[1]s (or use --iptables-mode)", suffix))
	}
	return ""
}

// lenient is an int or bool flag that keeps its text, so a bad value is reported with the others.
type lenient[T any] struct {
	raw, typ, notA string
	def            T
	parse          func(string) (T, error)
}

func newInt(def int) *lenient[int] {
	return &lenient[int]{raw: strconv.Itoa(def), typ: "int", notA: "not an integer", def: def,
		parse: strconv.Atoi}
}

func newBool(def bool) *lenient[bool] {
	return &lenient[bool]{raw: strconv.FormatBool(def), typ: "bool", def: def, parse: strconv.ParseBool,
		notA: "not a boolean (want true or false)"}
}

func (f *lenient[T]) String() string     { return f.raw }
func (f *lenient[T]) Set(s string) error { f.raw = s; return nil }
func (f *lenient[T]) Type() string       { return f.typ }

// IsBoolFlag lets pflag take a bool flag ("--simulate") without a value, meaning true.
func (f *lenient[T]) IsBoolFlag() bool { return f.typ == "bool" }

// rawList is a repeatable, comma-separated list flag ("-r 80,81 -r 82", as Linkerd's slices) that
// keeps each occurrence as typed: iptables.Config.Validate splits it and names a bad element.
type rawList struct {
	values *[]string
	typ    string
}

// String is empty for an empty list so that help shows no "(default [])".
func (l *rawList) String() string { return strings.Join(*l.values, ",") }
func (l *rawList) Set(s string) error {
	*l.values = append(*l.values, s)
	return nil
}

func (l *rawList) Type() string { return l.typ }

// ruleset returns the rules Config asks for.
func (o *Options) ruleset() (*iptables.Ruleset, error) {
	if o.rules != nil {
		return o.rules, nil
	}
	return iptables.Build(o.Config)
}
