package proxyinit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/kubemesh/proxy-init/internal/buildinfo"
	"github.com/kubemesh/proxy-init/internal/logging"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/validator"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1
	ExitUsage   = 2
)

// ErrMismatch is returned by show when the rules in place differ from the flags; Main exits 1.
var ErrMismatch = errors.New("the rules in place do not match the configuration")

// Main runs proxy-init with args (without the program name), printing results to stdout and
// logs and errors to stderr, and returns the exit code. It changes nothing process-wide (OneShot).
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return run(ctx, args, stdout, stderr, runner.Runner{})
}

// OneShot reports whether args run a command that exits within milliseconds (all but validate),
// which wants no garbage collection, and SIGINT and SIGTERM ignored while it writes.
func OneShot(args []string) bool { return len(args) == 0 || args[0] != "validate" }

// run is Main with the backend path as a seam: tests give it a fake applier.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, r runner.Runner) int {
	// The network validator has its own flags, so it is dispatched before they are parsed.
	if len(args) > 0 && args[0] == "validate" {
		// Only the validator runs long enough to watch signals (a goroutine and a thread).
		ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
		defer stop()
		return validator.Main(ctx, args[1:], stdout, stderr)
	}
	o, err := Parse(args)
	if errors.Is(err, ErrHelp) {
		fmt.Fprint(stdout, Usage())
		return ExitOK
	}
	if err != nil { // a *badinput.UsageError: Parse reads only the command line
		fmt.Fprintln(stderr, "proxy-init: "+err.Error())
		return ExitUsage
	}
	log := logging.New(stderr, o.LogFormat, o.LogLevel)
	for _, w := range o.Warnings {
		log.Warn(w)
	}
	if err := execute(ctx, o, stdout, log, r); err != nil {
		if !errors.Is(err, ErrMismatch) {
			log.Error("proxy-init failed", "command", string(o.Command), "error", err.Error())
		}
		return ExitFailure
	}
	return ExitOK
}

// execute runs a parsed command line through r.
func execute(ctx context.Context, o *Options, stdout io.Writer, log *slog.Logger, r runner.Runner) error {
	switch cmd := o.Command; {
	case cmd == CommandVersion:
		info := buildinfo.Get()
		return writeReport(stdout, o.Output, info, func(w io.Writer) error {
			_, err := fmt.Fprintln(w, "proxy-init "+info.String())
			return err
		})
	case o.Simulate && (cmd == CommandApply || cmd == CommandCleanup):
		return simulate(ctx, o, stdout, log, r)
	case cmd == CommandApply:
		return apply(ctx, o, log, r)
	case cmd == CommandCleanup:
		return cleanup(ctx, o, log, r)
	case cmd == CommandShow && o.Inspect:
		return inspect(ctx, o, stdout, log, r)
	case cmd == CommandShow:
		return show(ctx, o, stdout, log, r)
	}
	return fmt.Errorf("command %q is not implemented", o.Command)
}

// target is where and how the command line asks to work. With --netns proxy-init runs on the
// node, where the CNI plugin and the node agent may write the namespace under their host lock: it
// takes that one too, first, when the node has its directory.
func (o *Options) target(log *slog.Logger) runner.Target {
	t := runner.Target{
		Options: runner.Options{Mode: o.Config.Mode, Wait: o.UseWaitFlag},
		NetNS:   o.NetNS,
		Log:     log.With("mode_from", o.ModeSource),
	}
	if _, err := os.Lstat(hostLockDir); o.NetNS != "" && err == nil {
		t.HostLockDir, t.InPodLock = hostLockDir, true
	}
	return t
}

// hostLockDir is where the node's host locks are (a variable for tests).
var hostLockDir = runner.DefaultHostLockDir

func apply(ctx context.Context, o *Options, log *slog.Logger, r runner.Runner) error {
	start := time.Now()
	rs, err := o.ruleset()
	if err != nil {
		return fmt.Errorf("build rules: %w", err)
	}
	if log.Enabled(ctx, slog.LevelInfo) { // with a thousand subnets the attributes are not free
		log.Info("configuration", configAttrs(o, rs)...)
	}
	out, err := r.Apply(ctx, o.target(log), rs)
	if err != nil {
		return err
	}
	log.Info("rules applied", "backend", out.Backend, "changed", out.Changed, "close_wait_secs", rs.CloseWaitSecs,
		"netns", netnsutil.Label(o.NetNS), "duration", time.Since(start).Round(time.Microsecond).String())
	return nil
}

func cleanup(ctx context.Context, o *Options, log *slog.Logger, r runner.Runner) error {
	start := time.Now()
	if _, err := r.Cleanup(ctx, o.target(log)); err != nil {
		return err
	}
	log.Info("rules removed from every backend", "netns", netnsutil.Label(o.NetNS), "duration", time.Since(start).Round(time.Microsecond).String())
	return nil
}

// ShowReport is what `show --output json` prints.
type ShowReport struct {
	Backend  string          `json:"backend"`
	Match    bool            `json:"match"`
	Families []FamilyReport  `json:"families"`
	Expected map[string]bool `json:"expected"` // family -> whether rules are expected in it
	// HalfApplied and WrittenWithout explain a state with one family complete and the other empty,
	// in a backend written one transaction per family or both at once.
	HalfApplied    string                 `json:"half_applied,omitempty"`
	WrittenWithout string                 `json:"written_without,omitempty"`
	Elsewhere      []iptables.Elsewhere   `json:"elsewhere,omitempty"` // ours in other backends: none expected
	Sysctls        []iptables.SysctlState `json:"sysctls,omitempty"`   // the settings asked for, read back
	Routes         *RouteReport           `json:"routes,omitempty"`    // tproxy's, when expected or in place
}

// RouteReport is the policy routing in place and its difference from the expected.
type RouteReport struct {
	Match   bool     `json:"match"`
	Lines   []string `json:"lines"`
	Missing []string `json:"missing,omitempty"`
	Extra   []string `json:"extra,omitempty"`
}

// FamilyReport is one family's rules in place and their difference from the expected ones.
type FamilyReport struct {
	Family    string   `json:"family"`
	Match     bool     `json:"match"`
	Rules     []string `json:"rules"`
	Missing   []string `json:"missing,omitempty"`
	Extra     []string `json:"extra,omitempty"`
	Reordered bool     `json:"reordered,omitempty"`
}

// NewShowReport converts a backend's State into the report show prints.
func NewShowReport(st iptables.State, rs *iptables.Ruleset) ShowReport {
	r := ShowReport{Backend: st.Backend, Match: st.Match(), Expected: map[string]bool{}, HalfApplied: st.HalfApplied(),
		WrittenWithout: st.WrittenWithout(), Elsewhere: st.Elsewhere, Sysctls: st.Sysctls, Routes: routeReport(st.Routes)}
	for _, f := range st.Families {
		// nftables reports one "inet" family for both; rules are always expected in it.
		r.Expected[string(f.Family)] = f.Family == iptables.FamilyInet || rs.HasFamily(f.Family)
		r.Families = append(r.Families, familyReport(f))
	}
	return r
}

func routeReport(rt *iptables.RouteState) *RouteReport {
	if rt == nil {
		return nil
	}
	// Lines and Rules are never null in the JSON.
	return &RouteReport{Match: rt.Diff.Empty(), Lines: append([]string{}, rt.Lines...), Missing: rt.Diff.Missing,
		Extra: rt.Diff.Extra}
}

func familyReport(f iptables.FamilyState) FamilyReport {
	return FamilyReport{Family: string(f.Family), Match: f.Diff.Empty(), Rules: append([]string{}, f.Rules...),
		Missing: f.Diff.Missing, Extra: f.Diff.Extra, Reordered: f.Diff.Reordered}
}

// WriteText renders the report for people.
func (r ShowReport) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "backend: %s\n", r.Backend)
	for _, f := range r.Families {
		want := "expected"
		if !r.Expected[f.Family] {
			want = "none expected"
		}
		fmt.Fprintf(&b, "%s (%s): %d lines in place, %s\n", f.Family, want, len(f.Rules), verdict(f.Match))
		writeFamilyLines(&b, f)
	}
	writeElsewhere(&b, r.Elsewhere)
	for _, c := range r.Sysctls {
		fmt.Fprintf(&b, "%s: %s, want %s: %s\n", c.File, c.Have, c.Want, verdict(c.Match()))
	}
	writeRoutes(&b, r.Routes)
	for _, s := range []string{r.HalfApplied, r.WrittenWithout} {
		if s != "" {
			b.WriteString(s + "\n")
		}
	}
	if r.Match {
		b.WriteString("rules match the configuration\n")
	} else {
		b.WriteString("rules do NOT match the configuration\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func verdict(match bool) string {
	if match {
		return "match"
	}
	return "DO NOT MATCH"
}

// writeFamilyLines writes a family's rules in place, indented, and how they differ.
func writeFamilyLines(b *strings.Builder, f FamilyReport) {
	for _, l := range f.Rules {
		fmt.Fprintf(b, "  %s\n", l)
	}
	for _, l := range f.Missing {
		fmt.Fprintf(b, "  missing: %s\n", l)
	}
	for _, l := range f.Extra {
		fmt.Fprintf(b, "  unexpected: %s\n", l)
	}
	if f.Reordered {
		fmt.Fprintf(b, "  the rules are in the wrong order\n")
	}
}

func writeElsewhere(b *strings.Builder, es []iptables.Elsewhere) {
	for _, e := range es {
		fmt.Fprintf(b, "%s also holds rules of ours (left by a run in another mode; apply or cleanup removes them):\n", e.Backend)
		for _, l := range e.Rules {
			fmt.Fprintf(b, "  unexpected: %s\n", l)
		}
	}
}

func writeRoutes(b *strings.Builder, rt *RouteReport) {
	if rt == nil {
		return
	}
	fmt.Fprintf(b, "policy routing: %d lines in place, %s\n", len(rt.Lines), verdict(rt.Match))
	writeFamilyLines(b, FamilyReport{Rules: rt.Lines, Missing: rt.Missing, Extra: rt.Extra})
}

func show(ctx context.Context, o *Options, stdout io.Writer, log *slog.Logger, r runner.Runner) error {
	rs, err := o.ruleset()
	if err != nil {
		return fmt.Errorf("build rules: %w", err)
	}
	st, err := r.Show(ctx, o.target(log), rs)
	if err != nil {
		return err
	}
	rep := NewShowReport(st, rs)
	if err := writeReport(stdout, o.Output, rep, rep.WriteText); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if !rep.Match {
		log.Warn("rules do not match the configuration", "backend", rep.Backend, "netns", netnsutil.Label(o.NetNS), "half_applied", rep.HalfApplied)
		return ErrMismatch
	}
	return nil
}

// simulate prints what apply or cleanup would do, changing nothing (runner.Runner.Simulate).
func simulate(ctx context.Context, o *Options, stdout io.Writer, log *slog.Logger, r runner.Runner) error {
	var rs *iptables.Ruleset
	if o.Command == CommandApply {
		var err error
		if rs, err = o.ruleset(); err != nil {
			return fmt.Errorf("build rules: %w", err)
		}
	}
	header := fmt.Sprintf("# proxy-init %s --simulate: nothing was written (mode %s, from %s)\n", o.Command, o.Config.Mode, o.ModeSource)
	_, err := io.WriteString(stdout, header+r.Simulate(ctx, o.target(log), rs))
	return err
}

func configAttrs(o *Options, rs *iptables.Ruleset) []any {
	c := o.Config
	redirect := "all"
	if len(rs.RedirectPorts) > 0 {
		redirect = join(rs.RedirectPorts)
	}
	attrs := []any{
		"incoming_proxy_port", c.InboundProxyPort,
		"outgoing_proxy_port", c.OutboundProxyPort,
		"proxy_uid", c.ProxyUID,
		"proxy_gid", c.ProxyGID,
		"ports_to_redirect", redirect,
		"inbound_ports_to_ignore", join(rs.InboundIgnorePorts),
		"outbound_ports_to_ignore", join(rs.OutboundIgnorePorts),
		"inbound_subnets_to_ignore", join(rs.InboundIgnoreSubnets),
		"outbound_subnets_to_ignore", join(rs.OutboundIgnoreSubnets),
		"families", join(rs.Families),
		"mode", string(c.Mode),
		"netns", netnsutil.Label(o.NetNS),
	}
	// The features beyond Linkerd's, only when on: a Linkerd command line logs what it always did.
	for _, f := range []struct {
		on    bool
		attrs []any
	}{
		{rs.IPv6Auto, []any{"ipv6", "auto"}},
		{rs.DNSPort != 0, []any{"redirect_dns_to_port", rs.DNSPort, "dns_servers", join(rs.DNSServers)}},
		{rs.TPROXY, []any{"inbound_mode", string(iptables.InboundTPROXY)}},
		{len(rs.OutboundRedirectPorts) > 0,
			[]any{"outbound_ports_to_redirect", join(rs.OutboundRedirectPorts)}},
		{len(rs.OutboundRedirectSubnets) > 0,
			[]any{"outbound_subnets_to_redirect", join(rs.OutboundRedirectSubnets)}},
		{len(rs.IgnoreInterfaces) > 0, []any{"interfaces_to_ignore", strings.Join(rs.IgnoreInterfaces, ",")}},
		{len(rs.IgnoreUIDs)+len(rs.IgnoreGIDs) > 0,
			[]any{"uids_to_ignore", fmt.Sprint(rs.IgnoreUIDs), "gids_to_ignore", fmt.Sprint(rs.IgnoreGIDs)}},
		{rs.DropInvalid, []any{"drop_invalid", true}},
		{len(rs.RerouteInterfaces) > 0,
			[]any{"reroute_virtual_interfaces", strings.Join(rs.RerouteInterfaces, ",")}},
	} {
		if f.on {
			attrs = append(attrs, f.attrs...)
		}
	}
	return attrs
}

// join lists ps with commas, each as fmt prints it (a Stringer's String, a string type's value).
func join[T any](ps []T) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprint(p)
	}
	return strings.Join(parts, ",")
}

// writeReport writes v as --output asks: indented JSON, or text.
func writeReport(w io.Writer, output string, v any, text func(io.Writer) error) error {
	if output != "json" {
		return text(w)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
