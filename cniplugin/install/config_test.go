package install

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func envFrom(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigFromEnv(t *testing.T) {
	base := map[string]string{"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
	t.Run("Linkerd's defaults", func(t *testing.T) {
		cfg, err := ConfigFromEnv(envFrom(base))
		if err != nil {
			t.Fatal(err)
		}
		d := cfg.withDefaults()
		for _, c := range []struct{ name, got, want string }{
			{"DEST_CNI_NET_DIR", d.DestNetDir, "/etc/cni/net.d"},
			{"DEST_CNI_BIN_DIR", d.DestBinDir, "/opt/cni/bin"},
			{"CONTAINER_MOUNT_PREFIX", d.MountPrefix, "/host"},
			{"CONTAINER_CNI_BIN_DIR", d.ContainerBinDir, "/opt/cni/bin"},
			{"KUBECONFIG_FILE_NAME", d.KubeconfigFileName, "ZZZ-linkerd-cni-kubeconfig"},
			{"KUBE_CA_FILE", d.KubeCAFile, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"},
			{"CNI_NETWORK_CONFIG", d.NetworkConfig, DefaultNetworkConfig},
			{"net dir in the container", d.netDir(), "/host/etc/cni/net.d"},
			{"kubeconfig in the container", d.kubeconfigPath(), "/host/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
			{"kubeconfig on the node", d.kubeconfigHostPath(), "/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
			{"server", d.serverURL(), "https://10.96.0.1:443"},
		} {
			if c.got != c.want {
				t.Errorf("%s = %q, want %q", c.name, c.got, c.want)
			}
		}
	})
	t.Run("overrides", func(t *testing.T) {
		env := map[string]string{
			"KUBERNETES_SERVICE_HOST": "2001:db8::1", "KUBERNETES_SERVICE_PORT": "6443",
			"DEST_CNI_NET_DIR": "/var/lib/rancher/k3s/agent/etc/cni/net.d", "DEST_CNI_BIN_DIR": "/var/lib/rancher/k3s/data/current/bin",
			"CONTAINER_MOUNT_PREFIX": "/node", "KUBECONFIG_FILE_NAME": "linkerd.kubeconfig", "SKIP_TLS_VERIFY": "true",
			"POD_NAMESPACE": "mesh-cni", "CNI_NETWORK_CONFIG_FILE": "/etc/linkerd/cni.json", "POD_NAME": "linkerd-cni-x",
		}
		cfg, err := ConfigFromEnv(envFrom(env))
		if err != nil {
			t.Fatal(err)
		}
		d := cfg.withDefaults()
		if d.netDir() != "/node/var/lib/rancher/k3s/agent/etc/cni/net.d" || d.binDir() != "/node/var/lib/rancher/k3s/data/current/bin" {
			t.Errorf("dirs = %s, %s", d.netDir(), d.binDir())
		}
		if d.serverURL() != "https://[2001:db8::1]:6443" {
			t.Errorf("server = %s", d.serverURL())
		}
		if !d.SkipTLSVerify || d.Namespace != "mesh-cni" || d.NetworkConfigFile != "/etc/linkerd/cni.json" || d.PodName != "linkerd-cni-x" {
			t.Errorf("cfg = %+v", d)
		}
	})
	t.Run("every error at once", func(t *testing.T) {
		_, err := ConfigFromEnv(envFrom(map[string]string{
			"KUBERNETES_SERVICE_PORT": "http", "SKIP_TLS_VERIFY": "maybe",
			"DEST_CNI_NET_DIR": "etc/cni", "KUBECONFIG_FILE_NAME": "kube.conf",
			"LINKERD_CNI_STANDALONE_CONF": "multus/linkerd-cni.conflist",
		}))
		if err == nil {
			t.Fatal("no error")
		}
		for _, want := range []string{`KUBERNETES_SERVICE_HOST "": not set`, `KUBERNETES_SERVICE_PORT "http": not a port number`,
			`SKIP_TLS_VERIFY "maybe": not a boolean`, `DEST_CNI_NET_DIR "etc/cni": not an absolute path`, `KUBECONFIG_FILE_NAME "kube.conf"`,
			`LINKERD_CNI_STANDALONE_CONF "multus/linkerd-cni.conflist": must be a plain file name ending in .conf`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error lacks %q:\n%v", want, err)
			}
		}
	})
}

func TestRunRefusesBadConfig(t *testing.T) {
	tests := []struct {
		name string
		mod  func(h *host)
		want string
	}{
		{"network config file missing", func(h *host) { h.cfg.NetworkConfigFile = h.root + "/nope.json" }, "CNI_NETWORK_CONFIG_FILE: open " + "%ROOT%/nope.json"},
		{"network config invalid", func(h *host) { h.cfg.NetworkConfig = `{"type":` }, "CNI_NETWORK_CONFIG: invalid JSON"},
		{"plugin binary missing from the image", func(h *host) { os.Remove(h.imageBin + "/linkerd-cni") }, "plugin binary: copy: stat %ROOT%/image/opt/cni/bin/linkerd-cni: no such file or directory"},
		// The kubeconfig comes before the binary: no plugin on the node without it.
		{"service account token missing", func(h *host) { os.Remove(h.saDir + "/token") },
			"service account token %ROOT%/sa/token does not exist: is automountServiceAccountToken disabled for the DaemonSet's pods?"},
		{"port not numeric", func(h *host) { h.cfg.ServicePort = "https" }, `KUBERNETES_SERVICE_PORT "https": not a port number`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHost(t)
			h.write(t, "10-calico.conflist", calicoConflist)
			h.cfg.AdminAddr = "-"
			tt.mod(h)
			ctx, cancel := contextWithTimeout(5 * time.Second)
			defer cancel()
			err := Run(ctx, h.cfg, nil)
			want := strings.ReplaceAll(tt.want, "%ROOT%", h.root)
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Fatalf("Run = %v, want an error containing %q", err, want)
			}
			if got := h.read(t, "10-calico.conflist"); got != calicoConflist {
				t.Error("config changed although the installer refused to start")
			}
			// No plugin is put on the node.
			if _, err := os.Stat(filepath.Join(h.binDir, "linkerd-cni")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the plugin was copied to the node (err %v)", err)
			}
		})
	}
}

func TestMainExitCodes(t *testing.T) {
	env := envFrom(map[string]string{})
	tests := []struct {
		name string
		args []string
		env  func(string) string
		code int
		want string
	}{
		{"help", []string{"--help"}, env, 0, "--admin-addr"},
		{"unknown flag", []string{"--bogus"}, env, 2, "unknown flag: --bogus"},
		{"stray argument", []string{"now"}, env, 2, `unexpected arguments ["now"]`},
		{"bad log format", []string{"--log-format=xml"}, env, 2, `--log-format "xml"`},
		{"bad log level", []string{"--log-level=loud"}, env, 2, `--log-level "loud": unknown log level; want trace, debug, info, warn or error`},
		// Linkerd's names, as proxy-init and the repair controller take them: past the flags,
		// only the environment is missing.
		{"Linkerd's trace level", []string{"--log-level=trace"}, env, 2, `KUBERNETES_SERVICE_HOST "": not set`},
		{"bad environment", nil, env, 2, `KUBERNETES_SERVICE_HOST "": not set`},
		// PID 1 of the test machine is not `linkerd-cni install`: it must not be signalled.
		{"pre-stop refuses a foreign PID 1", []string{"--pre-stop"}, env, 1, "not `linkerd-cni install`: not signalling it"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := mainWith(tt.args, tt.env, &stderr); code != tt.code || !strings.Contains(stderr.String(), tt.want) {
				t.Errorf("exit %d, stderr %q; want exit %d and %q", code, stderr.String(), tt.code, tt.want)
			}
		})
	}
}
