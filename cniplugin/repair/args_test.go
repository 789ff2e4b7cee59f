package repair

import (
	"strings"
	"testing"
)

func TestParseArgs(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    Config
		wantErr []string
	}{
		{
			name: "node from the environment, defaults",
			env:  map[string]string{EnvNodeName: "node-a"},
			want: Config{NodeName: "node-a", AdminAddr: DefaultAdminAddr, LogFormat: "plain", LogLevel: "info"},
		},
		{
			name: "flags",
			args: []string{"--admin-addr", "127.0.0.1:9991", "--kubeconfig", "/k", "--node-name", "node-b", "--log-format", "json", "--log-level", "debug"},
			env:  map[string]string{EnvNodeName: "node-a"},
			want: Config{NodeName: "node-b", AdminAddr: "127.0.0.1:9991", Kubeconfig: "/k", LogFormat: "json", LogLevel: "debug"},
		},
		{
			name:    "every problem at once",
			args:    []string{"--admin-addr", "9990", "--log-format", "xml", "--log-level", "loud"},
			wantErr: []string{`--node-name "": not set: set $` + EnvNodeName, `--admin-addr "9990"`, `--log-format "xml"`, `--log-level "loud"`},
		},
		{
			name: "Linkerd's chart: exact command line and environment",
			args: []string{"--admin-addr", "0.0.0.0:9990", "--log-format", "plain", "--log-level", "linkerd_cni_repair_controller=info,warn"},
			env:  map[string]string{EnvNodeName: "node-a", EnvPodName: "linkerd-cni-x7k2p"},
			want: Config{NodeName: "node-a", PodName: "linkerd-cni-x7k2p", AdminAddr: "0.0.0.0:9990", LogFormat: "plain", LogLevel: "linkerd_cni_repair_controller=info,warn"},
		},
		{
			name: "Linkerd's other variables and flags",
			args: []string{"--controller-pod-name", "p2"},
			env:  map[string]string{EnvNodeName: "node-a", EnvPodName: "p1", EnvLogLevel: "debug", EnvLogFormat: "json"},
			want: Config{NodeName: "node-a", PodName: "p2", AdminAddr: DefaultAdminAddr, LogFormat: "json", LogLevel: "debug"},
		},
		{
			name:    "a span filter is refused, naming the value",
			env:     map[string]string{EnvNodeName: "n"},
			args:    []string{"--log-level", "linkerd_cni_repair_controller[pods]=debug"},
			wantErr: []string{`--log-level "linkerd_cni_repair_controller[pods]=debug": span and field filters are not supported`},
		},
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
			if err != nil || got != tc.want {
				t.Fatalf("ParseArgs = %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}
