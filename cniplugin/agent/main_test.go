package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/iptables"
)

func TestParseArgs(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	defaults := Config{NodeName: "node-a", Mode: ModeRepair, Socket: cniplugin.DefaultAgentSocket, KubeletPodsSocket: DefaultKubeletPodsSocket, LookupWait: time.Second,
		AuditPeriod: time.Minute, CRI: DefaultCRI, HostProc: DefaultHostProc, NetNSDir: DefaultNetNSDir, CNINetDir: DefaultCNINetDir, PluginLogs: true,
		InstallerReadyURL: DefaultInstallerReadyURL, AdminAddr: DefaultAdminAddr, LogFormat: "plain", LogLevel: "info"}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    func(*Config)
		wantErr []string
	}{
		{name: "defaults, the node from the environment", env: map[string]string{EnvNodeName: "node-a"}},
		{
			name: "the chart's command line",
			args: []string{"--mode=delete", "--socket=/var/run/linkerd-cni/agent.sock", "--kubelet-pods-socket=/host/kubelet/pods-api/pods-api.sock", "--lookup-wait=2s", "--audit-period=30s",
				"--cri-socket=unix:///host/run/k3s/containerd/containerd.sock", "--host-proc=/host/proc", "--netns-dir=/var/run/netns", "--pid-fallback", "--cni-net-dir=/host/etc/cni/net.d",
				"--plugin-logs=false", "--installer-ready-url=http://127.0.0.1:9992/ready", "--admin-addr=127.0.0.1:9993", "--log-format=json", "--log-level=linkerd_cni_agent=debug,info"},
			env: map[string]string{EnvNodeName: "node-a", EnvPodName: "linkerd-cni-x7k2p"},
			want: func(c *Config) {
				c.Mode, c.LookupWait, c.AuditPeriod, c.CRI, c.PluginLogs, c.LogFormat = ModeDelete, 2*time.Second, 30*time.Second,
					"unix:///host/run/k3s/containerd/containerd.sock", false, "json"
				c.PodName, c.LogLevel, c.PIDFallback = "linkerd-cni-x7k2p", "linkerd_cni_agent=debug,info", true
			},
		},
		{name: "lookups, audits and the installer's readiness off", env: map[string]string{EnvNodeName: "node-a"},
			args: []string{"--socket=", "--kubelet-pods-socket=", "--audit-period=0", "--cri-socket=nonsense", "--host-proc=proc", "--installer-ready-url="},
			want: func(c *Config) {
				c.KubeletPodsSocket = ""
				c.Socket, c.AuditPeriod, c.CRI, c.HostProc, c.InstallerReadyURL = "", 0, "nonsense", "proc", ""
			}},
		{
			name: "every problem at once",
			args: []string{"--mode=heal", "--socket=agent.sock", "--kubelet-pods-socket=pods-api.sock", "--lookup-wait=0s", "--audit-period=-1s", "--admin-addr=9993", "--log-format=xml"},
			wantErr: []string{`--node-name "": not set: set $KUBERNETES_NODE_NAME`, `--mode "heal": want repair, delete or report`,
				`--socket "agent.sock": not an absolute path`, `--kubelet-pods-socket "pods-api.sock": not an absolute path`, `--lookup-wait "0s": must be positive`,
				`--audit-period "-1s": must be 0 (no audits) or positive`, `--admin-addr "9993": want host:port`, `--log-format "xml"`},
		},
		{name: "audit paths", env: map[string]string{EnvNodeName: "n"}, args: []string{"--cri-socket=tcp://x", "--host-proc=proc", "--netns-dir=netns", "--cni-net-dir=net.d"},
			wantErr: []string{`--cri-socket "tcp://x": want unix:///path/to/socket`, `--host-proc "proc": not an absolute path`, `--netns-dir "netns": not an absolute path`, `--cni-net-dir "net.d": not an absolute path`}},
		{name: "lookups need the node's /proc", env: map[string]string{EnvNodeName: "n"}, args: []string{"--audit-period=0", "--host-proc=proc", "--installer-ready-url=127.0.0.1:9992"},
			wantErr: []string{`--host-proc "proc": not an absolute path`, `--installer-ready-url "127.0.0.1:9992": want an http:// URL`}},
		{name: "stray argument", env: map[string]string{EnvNodeName: "n"}, args: []string{"now"}, wantErr: []string{`unexpected arguments ["now"]`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseArgs(tc.args, env(tc.env))
			if tc.wantErr != nil {
				if err == nil {
					t.Fatalf("ParseArgs = %+v, want an error", got)
				}
				for _, w := range tc.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			want := defaults
			if tc.want != nil {
				tc.want(&want)
			}
			if err != nil || got != want {
				t.Fatalf("ParseArgs = %+v, %v; want %+v", got, err, want)
			}
		})
	}
}

func TestNetConfSource(t *testing.T) {
	dir := t.TempDir()
	s := &NetConfSource{Dir: dir}
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	expectErr := func(want string) {
		t.Helper()
		if _, err := s.Load(); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Load = %v, want %q", err, want)
		}
	}
	expectErr("no CNI config in " + dir + " yet")
	write("10-calico.conflist", `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"calico"}]}`)
	expectErr(filepath.Join(dir, "10-calico.conflist") + " does not chain linkerd-cni yet")
	// The installer's edit: the file the runtime reads (the first) chains the plugin.
	write("10-calico.conflist", `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"calico"},
		{"type":"linkerd-cni","kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},
		 "linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":2102,"iptables-mode":"nftables"}}]}`)
	write("99-other.conflist", `{"cniVersion":"1.0.0","name":"other","plugins":[{"type":"bridge"}]}`)
	conf, err := s.Load()
	if err != nil {
		t.Fatal(err)
	}
	if conf.Name != "k8s-pod-network" || conf.CNIVersion != "1.0.0" || conf.Linkerd.Mode != iptables.ModeNFTables || conf.Linkerd.ProxyUID != 2102 {
		t.Errorf("Load = %+v", conf)
	}
	write("10-calico.conflist", `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"calico"},
		{"type":"linkerd-cni","kubernetes":{"kubeconfig":"/k"},"linkerd":{"incoming-proxy-port":0,"outgoing-proxy-port":4140}}]}`)
	expectErr(`the linkerd-cni entry: invalid linkerd-cni network config: linkerd.incoming-proxy-port "0"`)
}
