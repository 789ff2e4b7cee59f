package repair

import (
	"cmp"
	"context"
	"io"
	"log/slog"
	"os"

	"github.com/spf13/pflag"

	"github.com/kubemesh/proxy-init/cniplugin/agent"
)

// EnvNodeName names the node whose pods are repaired (Linkerd's variable, set from
// spec.nodeName by the DaemonSet).
const EnvNodeName = "LINKERD_CNI_REPAIR_CONTROLLER_NODE_NAME"

// Linkerd's repair controller also reads these: the pod's own name (the DaemonSet sets it from
// metadata.name; it names the Events' reporting instance) and defaults for the log flags.
const (
	EnvPodName   = "LINKERD_CNI_REPAIR_CONTROLLER_POD_NAME"
	EnvLogLevel  = "LINKERD_CNI_REPAIR_CONTROLLER_LOG_LEVEL"
	EnvLogFormat = "LINKERD_CNI_REPAIR_CONTROLLER_LOG_FORMAT"
)

// Target is the repair controller's tracing target in Linkerd (its crate name): a --log-level
// filter's directives for it apply to us.
const Target = "linkerd_cni_repair_controller"

// DefaultAdminAddr is where /live, /ready and /metrics are served, as in Linkerd.
const DefaultAdminAddr = "0.0.0.0:9990"

var command = agent.Command{Name: "repair", NodeEnv: EnvNodeName, Target: Target,
	About: "linkerd-cni repair deletes the pods on this node whose linkerd-network-validator exited 95."}

// Config is the command line of `linkerd-cni repair`.
type Config struct {
	NodeName, PodName   string
	AdminAddr           string
	Kubeconfig          string
	LogFormat, LogLevel string
}

// AddFlags registers the flags on fs, bound to c; c's values are the defaults shown.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&c.AdminAddr, "admin-addr", c.AdminAddr, "address serving /live, /ready and /metrics")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig to use outside a cluster (default $KUBECONFIG, else the in-cluster service account)")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "node whose pods are repaired (default $"+EnvNodeName+")")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format: plain or json (default $"+EnvLogFormat+", else plain)")
	fs.StringVar(&c.PodName, "controller-pod-name", c.PodName, "this pod's name, the reporting instance of the Events (default $"+EnvPodName+")")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: trace, debug, info, warn, error, or a filter such as "+Target+"=info,warn (default $"+EnvLogLevel+", else info)")
}

// ParseArgs reads the arguments after "repair", with defaults from getenv.
func ParseArgs(args []string, getenv func(string) string) (Config, error) {
	c := Config{NodeName: getenv(EnvNodeName), PodName: getenv(EnvPodName), AdminAddr: DefaultAdminAddr,
		LogFormat: cmp.Or(getenv(EnvLogFormat), "plain"), LogLevel: cmp.Or(getenv(EnvLogLevel), "info")}
	if err := command.Parse(args, c.AddFlags); err != nil {
		return c, err
	}
	return c, command.CheckCommon(nil, c.NodeName, c.AdminAddr, c.LogFormat, c.LogLevel)
}

// Main runs `linkerd-cni repair` (the node agent as Linkerd's repair controller) with args (after
// "repair") until ctx ends, and returns the exit code: 0 after a clean shutdown, 2 for bad usage,
// 1 for any other failure.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := ParseArgs(args, os.Getenv)
	run := func(log *slog.Logger) error {
		if err := agent.Run(ctx, AgentOptions(c, log), c.Kubeconfig, c.AdminAddr, "linkerd-cni-repair-controller"); err != nil {
			return err
		}
		log.Info("repair controller stopped")
		return nil
	}
	return command.Main(err, c.AddFlags, c.LogFormat, c.LogLevel, stdout, stderr, "repair controller failed", run)
}

// AgentOptions are the node agent's options for c: delete mode, no socket, no audit, Linkerd's
// metric prefix and Events' controller.
func AgentOptions(c Config, log *slog.Logger) agent.Options {
	return agent.Options{NodeName: c.NodeName, PodName: c.PodName, Mode: agent.ModeDelete, Log: log,
		MetricsPrefix: agent.RepairMetricsPrefix, ReportingController: agent.EventReportingController}
}
