package agent

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/internal/logging"
)

// Command is what `linkerd-cni agent` and `linkerd-cni repair` (the agent under Linkerd's names)
// share as subcommands: one parse, the checks of the flags both have, one way to exit on help or
// bad input, one logger. Each keeps its own flags, defaults and environment.
type Command struct {
	Name    string // the subcommand, as typed after linkerd-cni
	About   string // the first line of --help
	NodeEnv string // the variable --node-name defaults to
	Target  string // the --log-level filter's target
}

// Parse parses args with the flags addFlags registers. --help comes back as pflag.ErrHelp.
func (cmd Command) Parse(args []string, addFlags func(*pflag.FlagSet)) error {
	fs := cmd.flags(addFlags)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return err
		}
		return fmt.Errorf("%w (see linkerd-cni %s --help)", err, cmd.Name)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	return nil
}

// flags returns the command's flags, in the order addFlags registers them, printing nothing.
func (cmd Command) flags(addFlags func(*pflag.FlagSet)) *pflag.FlagSet {
	fs := pflag.NewFlagSet(cmd.Name, pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.SortFlags = false
	addFlags(fs)
	return fs
}

// CheckCommon returns the problems of the flags every node command has, after those of its own.
func (cmd Command) CheckCommon(probs []badinput.Problem, nodeName, adminAddr, logFormat, logLevel string) error {
	bad := func(field, value, reason string) {
		probs = append(probs, badinput.Problem{Field: field, Value: value, Reason: reason})
	}
	if nodeName == "" {
		bad("--node-name", "", "not set: set $"+cmd.NodeEnv+" (the DaemonSet sets it from spec.nodeName) or --node-name")
	}
	if _, _, err := net.SplitHostPort(adminAddr); err != nil {
		bad("--admin-addr", adminAddr, "want host:port")
	}
	if err := logging.CheckFormat(logFormat); err != nil {
		bad("--log-format", logFormat, err.Error())
	}
	if _, err := logging.ParseFilter(logLevel, cmd.Target); err != nil {
		bad("--log-level", logLevel, err.Error())
	}
	if len(probs) > 0 {
		return &badinput.Error{What: "invalid input", Problems: probs}
	}
	return nil
}

// Main ends the command's main with what Parse and the checks returned: help on stdout (exit 0),
// bad usage on stderr (exit 2); else it runs run with the command's logger on stderr (client-go's
// klog lines go to it too, in the same format), logging run's error as failed (exit 1).
func (cmd Command) Main(err error, addFlags func(*pflag.FlagSet), format, level string, stdout, stderr io.Writer,
	failed string, run func(*slog.Logger) error) int {
	switch bad, isBad := badinput.As(err); {
	case errors.Is(err, pflag.ErrHelp):
		fmt.Fprint(stdout, cmd.About+"\n\nFlags:\n"+cmd.flags(addFlags).FlagUsages())
		return 0
	case isBad:
		fmt.Fprint(stderr, "linkerd-cni "+cmd.Name+": "+bad.Lines())
		return 2
	case err != nil:
		fmt.Fprintln(stderr, "linkerd-cni "+cmd.Name+": "+err.Error())
		return 2
	}
	filter, _ := logging.ParseFilter(level, cmd.Target)
	log := logging.New(stderr, format, filter.Level)
	filter.Log(log)
	klog.SetSlogLogger(log.With("component", "client-go"))
	if err := run(log); err != nil {
		log.Error(failed, "error", err.Error())
		return 1
	}
	return 0
}
