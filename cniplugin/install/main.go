package install

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/internal/logging"
)

// Main is `linkerd-cni install [flags]`: it reads the environment, runs the installer until
// SIGTERM or SIGINT, and returns the exit code: 0 after a clean removal, 1 on a runtime error, 2 on
// bad flags or environment. `--pre-stop` is for the DaemonSet's preStop hook: it sends SIGTERM to
// the installer (PID 1, checked to be `linkerd-cni install`) and returns, so removal starts while
// the kubelet still honours the grace period.
func Main(args []string) int {
	return mainWith(args, os.Getenv, os.Stderr)
}

func mainWith(args []string, getenv func(string) string, stderr io.Writer) int {
	fs := pflag.NewFlagSet("linkerd-cni install", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	adminAddr := fs.String("admin-addr", DefaultAdminAddr, `address serving /ready and /live ("-" disables them)`)
	logFormat := fs.String("log-format", "plain", "log format: plain or json")
	logLevel := fs.String("log-level", "info", "log level: trace, debug, info, warn or error")
	preStop := fs.Bool("pre-stop", false, "signal the running installer (PID 1) to uninstall, then return")
	nodeTaint := fs.String("node-taint", "", "remove this startup taint key (any effect) from the node once linkerd-cni "+
		"is in every CNI config file; needs get and patch on nodes (default $"+EnvNodeTaint+")")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "linkerd-cni install: %v\n", err)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "linkerd-cni install: unexpected arguments %q\n", fs.Args())
		return 2
	}
	level, err := logging.ParseLevel(*logLevel)
	if err != nil {
		fmt.Fprintf(stderr, "linkerd-cni install: --log-level %q: %v\n", *logLevel, err)
		return 2
	}
	if err := logging.CheckFormat(*logFormat); err != nil {
		fmt.Fprintf(stderr, "linkerd-cni install: --log-format %q: %v\n", *logFormat, err)
		return 2
	}
	log := logging.New(stderr, *logFormat, level)
	if *preStop {
		if err := signalInstaller(1); err != nil {
			log.Error("pre-stop", "error", err)
			return 1
		}
		return 0
	}
	cfg, err := ConfigFromEnv(getenv)
	if bad, ok := badinput.As(err); ok {
		fmt.Fprint(stderr, "linkerd-cni install: "+bad.Lines())
		return 2
	}
	cfg.AdminAddr = *adminAddr
	if fs.Changed("node-taint") {
		cfg.NodeTaint = *nodeTaint
		if err := cfg.validate(); err != nil {
			fmt.Fprintf(stderr, "linkerd-cni install: %v\n", err)
			return 2
		}
	}
	if cfg.NodeTaint != "" {
		// client-go logs through klog: same place, same format.
		klog.SetSlogLogger(log.With("component", "client-go"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := Run(ctx, cfg, log); err != nil {
		log.Error("linkerd-cni install failed", "error", err)
		return 1
	}
	return 0
}

// signalInstaller sends SIGTERM to pid after checking its command line: a preStop hook in a pod
// that shares a PID namespace must not terminate anything but `linkerd-cni install`.
func signalInstaller(pid int) error {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return fmt.Errorf("read command line of pid %d: %w", pid, err)
	}
	argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	if len(argv) < 2 || !strings.Contains(argv[0], "linkerd-cni") || argv[1] != "install" {
		return fmt.Errorf("pid %d is %q, not `linkerd-cni install`: not signalling it", pid, strings.Join(argv, " "))
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("signal pid %d: %w", pid, err)
	}
	return nil
}
