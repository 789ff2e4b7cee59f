package agent

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/internal/badinput"
)

// The agent's environment, set by the DaemonSet.
const (
	EnvNodeName = "KUBERNETES_NODE_NAME"
	EnvPodName  = "POD_NAME"
)

// Target is the agent's log filter target: a --log-level filter's directives for it apply.
const Target = "linkerd_cni_agent"

// Defaults of `linkerd-cni agent`.
const (
	DefaultAdminAddr   = "127.0.0.1:9993"
	DefaultAuditPeriod = time.Minute
	DefaultCRI         = "unix:///run/containerd/containerd.sock"
	DefaultHostProc    = "/host/proc"
	DefaultNetNSDir    = "/var/run/netns"
	DefaultCNINetDir   = "/host/etc/cni/net.d"
	// DefaultInstallerReadyURL is the installer's /ready at its default admin address
	// (install.DefaultAdminAddr), on the node's loopback.
	DefaultInstallerReadyURL = "http://127.0.0.1:9992/ready"
)

var command = Command{Name: "agent", NodeEnv: EnvNodeName, Target: Target,
	About: "linkerd-cni agent serves the CNI plugin's pod lookups on this node, audits every meshed pod's redirect and heals it in place."}

// Config is the command line of `linkerd-cni agent`.
type Config struct {
	NodeName, PodName string
	Mode              Mode
	Socket            string
	KubeletPodsSocket string
	LookupWait        time.Duration
	AuditPeriod       time.Duration
	CRI               string
	HostProc          string
	NetNSDir          string
	PIDFallback       bool
	CNINetDir         string
	PluginLogs        bool
	InstallerReadyURL string
	AdminAddr         string
	Kubeconfig        string
	LogFormat         string
	LogLevel          string
}

// AddFlags registers the flags on fs, bound to c; c's values are the defaults shown.
func (c *Config) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar((*string)(&c.Mode), "mode", string(c.Mode), "what to do about a meshed pod whose rules are missing or different: repair (rewrite them in place), delete (delete the pod, as Linkerd's repair controller does), report (Events and metrics only)")
	fs.StringVar(&c.Socket, "socket", c.Socket, `UNIX socket serving the CNI plugin's calls ("" disables it: the plugin asks the API)`)
	fs.StringVar(&c.KubeletPodsSocket, "kubelet-pods-socket", c.KubeletPodsSocket, `the kubelet's pods API socket (<kubelet root dir>/pods-api/pods-api.sock on the node), read when the agent's watch cannot answer a lookup, e.g. while the API server is down ("" disables it)`)
	fs.DurationVar(&c.LookupWait, "lookup-wait", c.LookupWait, "how long a plugin call waits for a pod the watch has not delivered yet, before the plugin asks the API")
	fs.DurationVar(&c.AuditPeriod, "audit-period", c.AuditPeriod, "audit every meshed pod of the node this often, besides on pod events (0 disables audits)")
	fs.StringVar(&c.CRI, "cri-socket", c.CRI, "the container runtime's CRI endpoint, to find each pod's network namespace")
	fs.StringVar(&c.HostProc, "host-proc", c.HostProc, "the node's /proc as this container sees it (the socket's peers are checked there)")
	fs.StringVar(&c.NetNSDir, "netns-dir", c.NetNSDir, "the node's /var/run/netns as this container sees it, where the runtime keeps the pods' network namespaces")
	fs.BoolVar(&c.PIDFallback, "pid-fallback", c.PIDFallback, "find the network namespace of a sandbox whose runtime names none under /var/run/netns through its process, in --host-proc (needs SYS_PTRACE)")
	fs.StringVar(&c.CNINetDir, "cni-net-dir", c.CNINetDir, "the node's CNI config directory as this container sees it (the plugin's config is read there)")
	fs.BoolVar(&c.PluginLogs, "plugin-logs", c.PluginLogs, "print the log lines of every plugin call on standard output (kubectl logs)")
	fs.StringVar(&c.InstallerReadyURL, "installer-ready-url", c.InstallerReadyURL, `the installer's /ready, for the installer_ready metric ("" disables it)`)
	fs.StringVar(&c.AdminAddr, "admin-addr", c.AdminAddr, "address serving /live, /ready and /metrics")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig to use outside a cluster (default $KUBECONFIG, else the in-cluster service account)")
	fs.StringVar(&c.NodeName, "node-name", c.NodeName, "node whose pods are served and audited (default $"+EnvNodeName+")")
	fs.StringVar(&c.PodName, "pod-name", c.PodName, "this pod's name, the reporting instance of the Events (default $"+EnvPodName+")")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format: plain or json")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level: trace, debug, info, warn, error, or a filter such as "+Target+"=debug,info")
}

// ParseArgs reads the arguments after "agent", with defaults from getenv.
func ParseArgs(args []string, getenv func(string) string) (Config, error) {
	c := Config{NodeName: getenv(EnvNodeName), PodName: getenv(EnvPodName), Mode: ModeRepair,
		Socket: cniplugin.DefaultAgentSocket, KubeletPodsSocket: DefaultKubeletPodsSocket, LookupWait: defaultLookupWait, AuditPeriod: DefaultAuditPeriod,
		CRI: DefaultCRI, HostProc: DefaultHostProc, NetNSDir: DefaultNetNSDir, CNINetDir: DefaultCNINetDir, PluginLogs: true,
		InstallerReadyURL: DefaultInstallerReadyURL, AdminAddr: DefaultAdminAddr, LogFormat: "plain", LogLevel: "info"}
	if err := command.Parse(args, c.AddFlags); err != nil {
		return c, err
	}
	var probs []badinput.Problem
	bad := func(field, value, reason string) {
		probs = append(probs, badinput.Problem{Field: field, Value: value, Reason: reason})
	}
	abs := func(field, path string, checked bool) {
		if checked && !filepath.IsAbs(path) {
			bad(field, path, "not an absolute path")
		}
	}
	if !slices.Contains(Modes, c.Mode) {
		bad("--mode", string(c.Mode), "want repair, delete or report")
	}
	abs("--socket", c.Socket, c.Socket != "")
	abs("--kubelet-pods-socket", c.KubeletPodsSocket, c.KubeletPodsSocket != "")
	if c.LookupWait <= 0 {
		bad("--lookup-wait", c.LookupWait.String(), "must be positive")
	}
	if c.AuditPeriod < 0 {
		bad("--audit-period", c.AuditPeriod.String(), "must be 0 (no audits) or positive")
	}
	abs("--host-proc", c.HostProc, c.AuditPeriod > 0 || c.Socket != "")
	if u, err := url.Parse(c.InstallerReadyURL); c.InstallerReadyURL != "" && (err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "") {
		bad("--installer-ready-url", c.InstallerReadyURL, "want an http:// URL")
	}
	if c.AuditPeriod > 0 && !strings.HasPrefix(strings.TrimPrefix(c.CRI, "unix://"), "/") {
		bad("--cri-socket", c.CRI, "want unix:///path/to/socket")
	}
	abs("--netns-dir", c.NetNSDir, c.AuditPeriod > 0)
	abs("--cni-net-dir", c.CNINetDir, c.AuditPeriod > 0)
	return c, command.CheckCommon(probs, c.NodeName, c.AdminAddr, c.LogFormat, c.LogLevel)
}

// Main runs `linkerd-cni agent` with args (after "agent") until ctx ends, and returns the exit
// code: 0 after a clean shutdown, 2 for bad usage, 1 for any other failure.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := ParseArgs(args, os.Getenv)
	run := func(log *slog.Logger) error {
		opts := Options{NodeName: c.NodeName, PodName: c.PodName, Mode: c.Mode, Socket: c.Socket, KubeletPodsSocket: c.KubeletPodsSocket, HostProc: c.HostProc,
			InstallerReadyURL: c.InstallerReadyURL, LookupWait: c.LookupWait, AuditPeriod: c.AuditPeriod, Log: log}
		if c.PluginLogs {
			opts.PluginLog = stdout
		}
		if c.AuditPeriod > 0 {
			criOpts := CRIOptions{Endpoint: c.CRI, NetNSDir: c.NetNSDir, Log: log}
			if c.PIDFallback {
				criOpts.HostProc = c.HostProc
			}
			cri, err := NewCRI(criOpts)
			if err != nil {
				return err
			}
			defer cri.Close()
			opts.Sandboxes, opts.NetConf, opts.NetNSDir = cri, &NetConfSource{Dir: c.CNINetDir}, c.NetNSDir
		}
		return Run(ctx, opts, c.Kubeconfig, c.AdminAddr, "linkerd-cni-agent")
	}
	return command.Main(err, c.AddFlags, c.LogFormat, c.LogLevel, stdout, stderr, "agent failed", run)
}

// RESTConfig returns the client configuration: kubeconfig if set, else $KUBECONFIG (which may
// list several files) if set, else the in-cluster service account.
func RESTConfig(kubeconfig string, getenv func(string) string) (*rest.Config, error) {
	env := getenv(clientcmd.RecommendedConfigPathEnvVar)
	if kubeconfig == "" && env == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (outside a cluster, pass --kubeconfig or set KUBECONFIG): %w", err)
		}
		return cfg, nil
	}
	// An explicit path wins over the precedence list.
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig, Precedence: filepath.SplitList(env)}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return cfg, nil
}

// Run builds the client, serves the admin endpoints on adminAddr and runs an agent with opts
// until ctx ends. userAgent names its API requests.
func Run(ctx context.Context, opts Options, kubeconfig, adminAddr, userAgent string) error {
	log := cmp.Or(opts.Log, slog.New(slog.DiscardHandler))
	restCfg, err := RESTConfig(kubeconfig, os.Getenv)
	if err != nil {
		return err
	}
	restCfg.UserAgent = userAgent
	client, err := kubeclient.New(restCfg)
	if err != nil {
		return err
	}
	a, err := New(client, opts)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", adminAddr)
	if err != nil {
		return fmt.Errorf("admin listener: %w", err)
	}
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 10 * time.Second}
	// Serve returns only on a failure, or once Shutdown below has run: either ends the agent.
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() { cancel(fmt.Errorf("admin server: %w", srv.Serve(ln))) }()
	log.Info("admin endpoints listening", "addr", ln.Addr().String())
	err = a.Run(runCtx)
	if cause := context.Cause(runCtx); cause != nil && ctx.Err() == nil {
		return cause // the admin server failed
	}
	shutdownCtx, stop := context.WithTimeout(context.Background(), 5*time.Second)
	defer stop()
	_ = srv.Shutdown(shutdownCtx)
	if err != nil && ctx.Err() == nil {
		return err
	}
	log.Info("stopped")
	return nil
}
