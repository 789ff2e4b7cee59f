package logging

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
)

// LevelOff is "off" in a filter: above every level a logger writes, so nothing is logged.
const LevelOff = slog.LevelError + 4

// Filter is a --log-level read by ParseFilter.
type Filter struct {
	// Level is what the logger writes at.
	Level slog.Level
	// Note says how Level was chosen from a multi-directive filter, for the log.
	Note string
}

// ParseFilter reads a --log-level as Linkerd's Rust programs take it: one level, or tracing-style
// comma-separated directives, each a level or target=level ("a_crate=info,warn"; target is this
// program's crate name). A directive applies without a target or when its target is a prefix of
// ours; of those, the most verbose wins (one logger has one level). When none applies, Level is
// error, so failures still show. Span and field selectors are refused.
func ParseFilter(s, target string) (Filter, error) {
	if !strings.ContainsAny(s, "=,[]{}") {
		lvl, err := parseFilterLevel(s)
		return Filter{Level: lvl}, err
	}
	if strings.ContainsAny(s, "[]{}") {
		return Filter{Level: slog.LevelInfo}, fmt.Errorf("span and field filters are not supported; want levels and target=level directives separated by commas, such as %s=info,warn", target)
	}
	best := LevelOff // above every level, so min keeps the most verbose directive's
	var applied []string
	for _, d := range strings.Split(s, ",") {
		d = strings.TrimSpace(d)
		if d == "" {
			continue // tracing skips empty directives too
		}
		tgt, lvlText, hasTarget := strings.Cut(d, "=")
		if !hasTarget {
			tgt, lvlText = "", d
		}
		tgt = strings.TrimSpace(tgt)
		if hasTarget && !validTarget(tgt) {
			return Filter{Level: slog.LevelInfo}, fmt.Errorf("directive %q: bad target %q; want a module path such as %s", d, tgt, target)
		}
		lvl, err := parseFilterLevel(lvlText)
		if err != nil {
			return Filter{Level: slog.LevelInfo}, fmt.Errorf("directive %q: %w", d, err)
		}
		if !strings.HasPrefix(target, tgt) {
			continue
		}
		best = min(best, lvl)
		applied = append(applied, d)
	}
	if len(applied) == 0 {
		return Filter{Level: slog.LevelError, Note: fmt.Sprintf("no directive of the log filter applies to %s; logging errors only", target)}, nil
	}
	return Filter{Level: best, Note: fmt.Sprintf("log filter: the directives for %s are %s; logging at %s, the most verbose of them", target, strings.Join(applied, ","), levelName(best))}, nil
}

// parseFilterLevel is ParseLevel plus tracing's "off".
func parseFilterLevel(s string) (slog.Level, error) {
	if strings.EqualFold(strings.TrimSpace(s), "off") {
		return LevelOff, nil
	}
	lvl, err := ParseLevel(s)
	if err != nil {
		return lvl, fmt.Errorf("unknown log level %q; want trace, debug, info, warn, error or off", strings.TrimSpace(s))
	}
	return lvl, nil
}

// validTarget accepts the characters of a Rust module path (a::b_c).
func validTarget(s string) bool {
	return s != "" && strings.Trim(s, "_:-.abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") == ""
}

func levelName(l slog.Level) string {
	switch l {
	case LevelTrace:
		return "trace"
	case LevelOff:
		return "off"
	}
	return strings.ToLower(l.String())
}

// Log writes f's note, if any, at f's level, so that it shows whatever the level is.
func (f Filter) Log(log *slog.Logger) {
	if f.Note != "" {
		log.Log(context.Background(), f.Level, f.Note)
	}
}
