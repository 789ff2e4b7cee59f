package kubeapi_test

import (
	"bytes"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/kubeapi"
)

// TestStatus: STATUS with the API client reads the kubeconfig and its linkerd-cni-context, and
// names what is wrong; it sends nothing.
func TestStatus(t *testing.T) {
	dir := t.TempDir()
	good := dir + "/kubeconfig"
	kc := `apiVersion: v1
kind: Config
clusters: [{name: local, cluster: {server: "https://[2001:db8::1]:6443", insecure-skip-tls-verify: true}}]
users: [{name: linkerd-cni, user: {token: abc}}]
contexts: [{name: linkerd-cni-context, context: {cluster: local, user: linkerd-cni}}]
current-context: linkerd-cni-context
`
	if err := os.WriteFile(good, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	noContext := dir + "/other"
	if err := os.WriteFile(noContext, []byte(strings.ReplaceAll(kc, "linkerd-cni-context", "other")), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := func(path string) []byte {
		return []byte(strings.Replace(`{"cniVersion":"1.1.0","name":"n","type":"linkerd-cni","kubernetes":{"kubeconfig":"KC"},
			"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140}}`, "KC", path, 1))
	}
	tests := []struct {
		name, path, want string
	}{
		{"readable", good, ""},
		{"missing", dir + "/missing", "linkerd-cni cannot look pods up: read kubeconfig " + dir + "/missing: open " + dir + "/missing: no such file or directory"},
		{"no linkerd-cni-context", noContext, "linkerd-cni cannot look pods up: kubeconfig " + noContext + ", context linkerd-cni-context: invalid configuration: [context was not found for specified context: linkerd-cni-context"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			p := &cniplugin.Plugin{Stderr: &logs, NewPodAPI: kubeapi.NewKubeClient}
			err := p.Status(&skel.CmdArgs{StdinData: conf(tt.path)})
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var ce *types.Error
			if !errors.As(err, &ce) || ce.Code != types.ErrPluginNotAvailable {
				t.Fatalf("err = %#v, want code %d", err, types.ErrPluginNotAvailable)
			}
			if !strings.HasPrefix(ce.Msg, tt.want) {
				t.Errorf("message\n got %q\nwant prefix %q", ce.Msg, tt.want)
			}
		})
	}
}
