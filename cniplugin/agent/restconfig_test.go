package agent

import (
	"os"
	"strings"
	"testing"
)

func TestRESTConfigOutsideACluster(t *testing.T) {
	// No flag, no KUBECONFIG, and (in a test) no service account: the error says what to do.
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, err := RESTConfig("", func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "pass --kubeconfig or set KUBECONFIG") {
		t.Fatalf("RESTConfig = %v, want the in-cluster error with advice", err)
	}
}

func TestRESTConfigFromKubeconfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, server string) string {
		p := dir + "/" + name
		cfg := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: " + server +
			"\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	flagFile := write("flag", "https://192.0.2.1:6443")
	envFile := write("env", "https://192.0.2.2:6443")
	tests := []struct {
		name, flag, env, wantHost string
	}{
		{name: "--kubeconfig wins over KUBECONFIG", flag: flagFile, env: envFile, wantHost: "https://192.0.2.1:6443"},
		{name: "KUBECONFIG list", env: dir + "/missing" + string(os.PathListSeparator) + envFile, wantHost: "https://192.0.2.2:6443"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := RESTConfig(tc.flag, func(k string) string {
				if k == "KUBECONFIG" {
					return tc.env
				}
				return ""
			})
			if err != nil || cfg.Host != tc.wantHost {
				t.Fatalf("RESTConfig = %v, %v; want host %s", cfg, err, tc.wantHost)
			}
		})
	}
}
