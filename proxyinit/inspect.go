package proxyinit

// show without rule flags: what every backend holds, its command line, whether whole (Inspect).

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
)

// FoundReport is what `show` without rule flags prints (`--output json`).
type FoundReport struct {
	// Backend holds the rules ("" when none does); Writes says how that backend writes them.
	Backend string `json:"backend"`
	Writes  string `json:"writes,omitempty"`
	// Families are the rules in place, and their difference from what Args writes: the command
	// line they were written from, whose --dns-servers-only found DNSServers.
	Families   []FamilyReport       `json:"families"`
	Args       []string             `json:"args,omitempty"`
	DNSServers []string             `json:"dns_servers,omitempty"`
	Elsewhere  []iptables.Elsewhere `json:"elsewhere,omitempty"`
	Routes     *RouteReport         `json:"routes,omitempty"`
	Whole      bool                 `json:"whole"`
	Notes      []string             `json:"notes,omitempty"`
	Problems   []string             `json:"problems,omitempty"`
}

// modeWrites lists the backends each explicit mode writes; auto may write any.
var modeWrites = map[iptables.Mode][]iptables.Backend{
	iptables.ModeLegacy:   {iptables.BackendLegacy},
	iptables.ModeNFT:      {iptables.BackendNFT},
	iptables.ModePlain:    {iptables.BackendLegacy, iptables.BackendNFT},
	iptables.ModeNFTables: {iptables.BackendNFTables},
}

// backendModes is the mode that writes each backend, for the command line read back.
var backendModes = map[iptables.Backend]iptables.Mode{
	iptables.BackendLegacy: iptables.ModeLegacy, iptables.BackendNFT: iptables.ModeNFT, iptables.BackendNFTables: iptables.ModeNFTables,
}

// NewFoundReport converts what Inspect found into the report show prints; a mode given on the
// command line (modeSource) must write the rules' backend.
func NewFoundReport(f iptables.Found, mode iptables.Mode, modeSource string) FoundReport {
	r := FoundReport{Backend: string(f.Backend), Elsewhere: f.Elsewhere, Notes: f.Notes, Problems: f.Problems, Routes: routeReport(f.Routes)}
	switch {
	case f.Backend == iptables.BackendNFTables:
		r.Writes = "one table for both families, written in one transaction"
	case f.PerFamily:
		r.Writes = "one iptables-restore per family"
	case f.Backend != "":
		r.Writes = "both families over netlink, in one transaction"
	}
	if want, ok := modeWrites[mode]; ok && f.Backend != "" && modeSource != "default" && !slices.Contains(want, f.Backend) {
		r.Problems = append(r.Problems, fmt.Sprintf("the rules are %s's, which mode %s (from %s) does not write: a run in another mode wrote them", f.Backend, mode, modeSource))
	}
	if f.Rules != nil {
		r.Args = append(f.Rules.Args(), "--"+iptables.FieldMode, string(backendModes[f.Backend]))
		for _, a := range f.Rules.DNSServers {
			r.DNSServers = append(r.DNSServers, a.String())
		}
	}
	for _, fs := range f.Families {
		r.Families = append(r.Families, familyReport(fs))
	}
	r.Whole = f.Whole() && len(r.Problems) == len(f.Problems)
	return r
}

// WriteText renders the report for people.
func (r FoundReport) WriteText(w io.Writer) error {
	var b strings.Builder
	if r.Backend == "" {
		b.WriteString("backend: none holds rules of ours\n")
	} else {
		fmt.Fprintf(&b, "backend: %s (%s)\n", r.Backend, r.Writes)
	}
	for _, f := range r.Families {
		fmt.Fprintf(&b, "%s: %d lines of ours\n", f.Family, len(f.Rules))
		writeFamilyLines(&b, f)
	}
	if len(r.Args) > 0 {
		fmt.Fprintf(&b, "written from: proxy-init %s\n", strings.Join(r.Args, " "))
	}
	if len(r.DNSServers) > 0 {
		fmt.Fprintf(&b, "  with the nameservers %s (--%s reads them from /etc/resolv.conf)\n", strings.Join(r.DNSServers, ", "), iptables.FieldDNSServersOnly)
	}
	writeElsewhere(&b, r.Elsewhere)
	writeRoutes(&b, r.Routes)
	for _, n := range r.Notes {
		b.WriteString("note: " + n + "\n")
	}
	for _, p := range r.Problems {
		b.WriteString("NOT whole: " + p + "\n")
	}
	if r.Whole {
		b.WriteString("whole: the rules in place are exactly what that command line writes, and no other backend holds rules of ours\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// inspect is show without rule flags.
func inspect(ctx context.Context, o *Options, stdout io.Writer, log *slog.Logger, r runner.Runner) error {
	in, err := r.Read(ctx, o.target(log))
	if err != nil {
		return err
	}
	rep := NewFoundReport(iptables.Inspect(in), o.Config.Mode, o.ModeSource)
	if err := writeReport(stdout, o.Output, rep, rep.WriteText); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if !rep.Whole {
		log.Warn("the rules in place are not whole", "backend", rep.Backend, "netns", netnsutil.Label(o.NetNS), "problems", strings.Join(rep.Problems, "; "))
		return ErrMismatch
	}
	return nil
}
