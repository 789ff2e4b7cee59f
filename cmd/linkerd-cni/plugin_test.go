package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/internal/kubeconfig"
	"github.com/kubemesh/proxy-init/test/cnitest"
)

// TestBothBuildsAreThePlugin: the node's build (-tags pluginonly) and the full one run the same
// plugin with the same API client: STATUS accepts the installer's JSON kubeconfig and refuses a
// YAML one (which a client-go client would have read) with the same error, in both.
func TestBothBuildsAreThePlugin(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the command twice: skipped with -short")
	}
	dir := t.TempDir()
	good, yaml := filepath.Join(dir, "kubeconfig.json"), filepath.Join(dir, "kubeconfig.yaml")
	if err := os.WriteFile(good, kubeconfig.Render(kubeconfig.Params{Server: "https://192.0.2.1:6443", Token: "t", InsecureSkipTLSVerify: true}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(yaml, []byte("apiVersion: v1\nkind: Config\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := func(kc string) string {
		return `{"cniVersion":"1.1.0","name":"k8s","type":"linkerd-cni","kubernetes":{"kubeconfig":"` + kc + `"},
			"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140}}`
	}
	for name, args := range map[string][]string{"full": {"."}, "pluginonly": cnitest.NodeBinaries} {
		t.Run(name, func(t *testing.T) {
			out := t.TempDir()
			if err := cnitest.GoBuild(out, args...); err != nil {
				t.Fatal(err)
			}
			for kc, want := range map[string]string{good: "", yaml: `"msg": "linkerd-cni cannot look pods up: kubeconfig ` + yaml + `: not JSON`} {
				cmd := exec.Command(filepath.Join(out, "linkerd-cni"))
				cmd.Env = []string{"CNI_COMMAND=STATUS", "CNI_PATH=/nonexistent"}
				cmd.Stdin = strings.NewReader(conf(kc))
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				err := cmd.Run()
				if (want == "") != (err == nil) || !strings.Contains(stdout.String(), want) {
					t.Errorf("STATUS with %s: %v, stdout %q, stderr %q; want %q", filepath.Base(kc), err, stdout.String(), stderr.String(), want)
				}
			}
		})
	}
}
