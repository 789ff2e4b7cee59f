package install

import (
	"cmp"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/kubemesh/proxy-init/internal/badinput"
)

// DefaultNetworkConfig is Linkerd's CNI network configuration (docs/linkerd-compatibility.md, "CNI
// network config"), used when neither CNI_NETWORK_CONFIG nor CNI_NETWORK_CONFIG_FILE is set.
const DefaultNetworkConfig = `{"name":"linkerd-cni","type":"linkerd-cni","log_level":"info",
 "kubernetes":{"kubeconfig":"__KUBECONFIG_FILEPATH__"},
 "linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102,
   "proxy-gid":-1,"ports-to-redirect":[],"inbound-ports-to-ignore":["4191","4190"],
   "outbound-ports-to-ignore":[],"subnets-to-ignore":[],"simulate":false,
   "use-wait-flag":false,"iptables-mode":"nft","ipv6":false}}`

// EnvStandaloneConf names the file the plugin's config is written into alone (Config.StandaloneConf).
const EnvStandaloneConf = "LINKERD_CNI_STANDALONE_CONF"

// standaloneCNIVersion is the standalone config's cniVersion when the template has none: the
// first with CHECK, which Multus and every runtime of the last years speak.
const standaloneCNIVersion = "0.4.0"

// DefaultServiceAccountDir is where Kubernetes mounts a pod's service account.
const DefaultServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// DefaultAdminAddr is where /ready and /live are served. Loopback: the DaemonSet runs in the host
// network namespace, and the endpoints have no business on the node's public addresses.
const DefaultAdminAddr = "127.0.0.1:9992"

// Config is the installer's configuration. The zero value of a field means its default;
// ConfigFromEnv fills it from the environment like Linkerd's install-cni.sh (envStrings).
type Config struct {
	// DestNetDir and DestBinDir are the node's CNI config and binary directories, as on the node.
	DestNetDir, DestBinDir string
	// MountPrefix is where the node's root is mounted in this container (default /host in the
	// environment): the installer writes MountPrefix+DestNetDir. In a Config, "" means no prefix.
	MountPrefix string
	// ContainerBinDir holds the plugin binary inside the image.
	ContainerBinDir string
	// NetworkConfig is the plugin configuration template; NetworkConfigFile, if set, wins.
	NetworkConfig, NetworkConfigFile string
	// KubeconfigFileName is the kubeconfig's name in the net dir.
	KubeconfigFileName string
	// ServiceAccountDir holds token, ca.crt and namespace; KubeCAFile overrides the CA.
	ServiceAccountDir, KubeCAFile string
	// ServiceHost, ServicePort and ServiceProtocol (default https) locate the API server.
	ServiceHost, ServicePort, ServiceProtocol string
	// SkipTLSVerify writes insecure-skip-tls-verify instead of the CA (Linkerd compatibility).
	SkipTLSVerify bool
	// NodeName and CNIMTU fill the __KUBERNETES_NODE_NAME__ and __CNI_MTU__ placeholders.
	NodeName, CNIMTU string
	// Namespace is the DaemonSet's, put into exclude-namespaces: the plugin skips its own pods.
	Namespace string
	// PodName is the installer's own pod, whose DaemonSet is looked up at SIGTERM
	// (successorComing). Without it, SIGTERM uninstalls.
	PodName string
	// AdminAddr is where /ready and /live are served; "-" disables them.
	AdminAddr string
	// Debounce is how long a burst of file events is collected before a sync (default 50ms).
	Debounce time.Duration
	// Resync is how often everything is re-checked without any event (default 1m), a safety net:
	// a dead watch is still fatal.
	Resync time.Duration
	// NodeTaint is the key of a startup taint removed (any effect) from node NodeName once every
	// config file carries the plugin. It needs get and patch on nodes (deploy/linkerd-cni/optional).
	NodeTaint string
	// StandaloneConf is a file name (e.g. linkerd-cni.conf): the plugin's config is then written
	// alone into that file of the net dir and chained into nothing, for Multus (OpenShift, RKE2) to
	// run as a NetworkAttachmentDefinition without spec.config, found by its name.
	StandaloneConf string
	// PluginLogOutput receives the plugin's log_file lines (default stdout: kubectl logs).
	PluginLogOutput io.Writer
	// PluginLogMaxSize is the size past which log_file is rotated to log_file.1.
	PluginLogMaxSize int64

	// Test hooks.
	onWrite         func(path string) // files written (and binaries removed), in order
	onAdminListen   func(addr net.Addr)
	taintBackoff    time.Duration // first retry delay of the taint removal
	taintBackoffMax time.Duration
}

// ConfigFromEnv reads the installer's environment variables
// (docs/linkerd-compatibility.md, "Installer environment"); unset ones keep
// their zero value, which means Linkerd's default. It reports every bad value at once.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	cfg := Config{MountPrefix: "/host"} // in a Config, "" means no prefix
	for _, v := range cfg.envStrings() {
		if e := getenv(v.name); e != "" {
			*v.field = e
		}
	}
	var probs []badinput.Problem
	if v := getenv("SKIP_TLS_VERIFY"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			probs = append(probs, badinput.Problem{Field: "SKIP_TLS_VERIFY", Value: v, Reason: "not a boolean"})
		}
		cfg.SkipTLSVerify = b
	}
	return cfg, cfg.validate(probs...)
}

// validate returns a *badinput.Error naming each variable (or flag) and value it refuses, after
// the problems found before.
func (c *Config) validate(probs ...badinput.Problem) error {
	bad := func(field, value, reason string) {
		probs = append(probs, badinput.Problem{Field: field, Value: value, Reason: reason})
	}
	if c.ServiceHost == "" {
		bad("KUBERNETES_SERVICE_HOST", "", "not set: the plugin's kubeconfig needs the API server address")
	}
	if c.ServicePort == "" {
		bad("KUBERNETES_SERVICE_PORT", "", "not set: the plugin's kubeconfig needs the API server port")
	} else if p, err := strconv.Atoi(c.ServicePort); err != nil || p < 1 || p > 65535 {
		bad("KUBERNETES_SERVICE_PORT", c.ServicePort, "not a port number")
	}
	for _, d := range []struct{ name, v string }{
		{"DEST_CNI_NET_DIR", c.DestNetDir}, {"DEST_CNI_BIN_DIR", c.DestBinDir},
		{"CONTAINER_CNI_BIN_DIR", c.ContainerBinDir},
	} {
		if d.v != "" && !path.IsAbs(d.v) {
			bad(d.name, d.v, "not an absolute path")
		}
	}
	if n := c.KubeconfigFileName; n != "" && (strings.ContainsRune(n, '/') || n == "." || n == "..") {
		bad("KUBECONFIG_FILE_NAME", n, "must be a plain file name")
	}
	if n := c.KubeconfigFileName; strings.HasSuffix(n, ".conf") || strings.HasSuffix(n, ".conflist") || strings.HasSuffix(n, ".json") {
		bad("KUBECONFIG_FILE_NAME", n, "a CNI config extension would make the runtime load the kubeconfig as a network config")
	}
	if n := c.StandaloneConf; n != "" && (strings.ContainsRune(n, '/') || !strings.HasSuffix(n, ".conf") || n == ".conf" || strings.HasPrefix(n, ".")) {
		bad(EnvStandaloneConf, n, "must be a plain file name ending in .conf (the plugin's config alone)")
	}
	if c.NodeTaint != "" {
		if msgs := validation.IsQualifiedName(c.NodeTaint); len(msgs) > 0 {
			bad("--node-taint", c.NodeTaint, "not a valid taint key: "+strings.Join(msgs, "; "))
		}
		if c.NodeName == "" {
			// The hostname the plugin template falls back to is not always the Node object's
			// name, and patching the wrong node would untaint it before its CNI is ready.
			bad("KUBERNETES_NODE_NAME", "", "not set, and --node-taint needs the node's name (the DaemonSet sets it from spec.nodeName)")
		}
	}
	if len(probs) > 0 {
		return &badinput.Error{What: "invalid installer environment", Problems: probs}
	}
	return nil
}

// envString is a string field of Config, its environment variable and its default ("" for none).
type envString struct {
	field     *string
	name, def string
}

// envStrings are Config's string fields read from the environment, with Linkerd's defaults.
func (c *Config) envStrings() []envString {
	return []envString{
		{&c.DestNetDir, "DEST_CNI_NET_DIR", "/etc/cni/net.d"},
		{&c.DestBinDir, "DEST_CNI_BIN_DIR", "/opt/cni/bin"},
		{&c.MountPrefix, "CONTAINER_MOUNT_PREFIX", ""},
		{&c.ContainerBinDir, "CONTAINER_CNI_BIN_DIR", "/opt/cni/bin"},
		{&c.NetworkConfig, "CNI_NETWORK_CONFIG", DefaultNetworkConfig},
		{&c.NetworkConfigFile, "CNI_NETWORK_CONFIG_FILE", ""},
		{&c.KubeconfigFileName, "KUBECONFIG_FILE_NAME", "ZZZ-linkerd-cni-kubeconfig"},
		{&c.ServiceAccountDir, "SERVICE_ACCOUNT_PATH", DefaultServiceAccountDir},
		{&c.KubeCAFile, "KUBE_CA_FILE", ""},
		{&c.ServiceHost, "KUBERNETES_SERVICE_HOST", ""},
		{&c.ServicePort, "KUBERNETES_SERVICE_PORT", ""},
		{&c.ServiceProtocol, "KUBERNETES_SERVICE_PROTOCOL", "https"},
		{&c.NodeName, "KUBERNETES_NODE_NAME", ""},
		{&c.CNIMTU, "CNI_MTU", "1500"},
		{&c.Namespace, "POD_NAMESPACE", ""},
		{&c.PodName, "POD_NAME", ""},
		{&c.NodeTaint, EnvNodeTaint, ""},
		{&c.StandaloneConf, EnvStandaloneConf, ""},
	}
}

// withDefaults fills unset fields.
func (c Config) withDefaults() Config {
	for _, v := range c.envStrings() {
		*v.field = cmp.Or(*v.field, v.def)
	}
	c.AdminAddr = cmp.Or(c.AdminAddr, DefaultAdminAddr)
	c.KubeCAFile = cmp.Or(c.KubeCAFile, filepath.Join(c.ServiceAccountDir, "ca.crt"))
	c.PluginLogOutput = cmp.Or(c.PluginLogOutput, io.Writer(os.Stdout))
	c.Debounce = positiveOr(c.Debounce, 50*time.Millisecond)
	c.Resync = positiveOr(c.Resync, time.Minute)
	c.PluginLogMaxSize = positiveOr(c.PluginLogMaxSize, DefaultPluginLogMaxSize)
	c.taintBackoff = positiveOr(c.taintBackoff, defaultTaintBackoff)
	if c.taintBackoffMax < c.taintBackoff {
		c.taintBackoffMax = max(defaultTaintBackoffMax, c.taintBackoff)
	}
	return c
}

// positiveOr is v when positive, else def.
func positiveOr[T int64 | time.Duration](v, def T) T {
	if v > 0 {
		return v
	}
	return def
}

// hostPath maps a path on the node to where this container sees it.
func (c *Config) hostPath(p string) string { return filepath.Join(c.MountPrefix, p) }

// netDir and binDir are the node's directories as this container sees them.
func (c *Config) netDir() string { return c.hostPath(c.DestNetDir) }
func (c *Config) binDir() string { return c.hostPath(c.DestBinDir) }

// kubeconfigPath is the kubeconfig as the container sees it, kubeconfigHostPath as the node does.
func (c *Config) kubeconfigPath() string     { return filepath.Join(c.netDir(), c.KubeconfigFileName) }
func (c *Config) kubeconfigHostPath() string { return path.Join(c.DestNetDir, c.KubeconfigFileName) }

// serverURL is the API server URL; JoinHostPort brackets IPv6 hosts.
func (c *Config) serverURL() string {
	host := strings.TrimSuffix(strings.TrimPrefix(c.ServiceHost, "["), "]")
	return c.ServiceProtocol + "://" + net.JoinHostPort(host, c.ServicePort)
}

// DefaultPluginLogMaxSize bounds the plugin's log_file (and so, with log_file.1, about twice it).
const DefaultPluginLogMaxSize = 10 << 20
