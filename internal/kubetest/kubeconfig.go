package kubetest

import (
	"encoding/base64"
	"fmt"
	"os"
)

// Names in the kubeconfig the linkerd-cni installer writes (DESIGN.md,
// "Installer environment").
const (
	KubeconfigCluster = "local"
	KubeconfigUser    = "linkerd-cni"
	KubeconfigContext = "linkerd-cni-context"
)

// WriteKubeconfig writes, with mode 0600, a kubeconfig for this cluster that
// authenticates with token, in the shape the linkerd-cni installer writes:
// cluster "local" (server Host, CA embedded), user "linkerd-cni", context
// "linkerd-cni-context" as current context. A process reading it must run
// in the cluster's network namespace to reach Host.
func (c *Cluster) WriteKubeconfig(path, token string) error {
	const tmpl = `apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[4]q
    certificate-authority-data: %[5]s
users:
- name: %[2]s
  user:
    token: %[6]q
contexts:
- name: %[3]s
  context:
    cluster: %[1]s
    user: %[2]s
current-context: %[3]s
`
	data := fmt.Sprintf(tmpl, KubeconfigCluster, KubeconfigUser, KubeconfigContext,
		c.Host, base64.StdEncoding.EncodeToString(c.CAData), token)
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	// WriteFile keeps the mode of an existing file; the token must not leak.
	if err := os.Chmod(path, 0o600); err != nil {
		return fmt.Errorf("chmod kubeconfig %s: %w", path, err)
	}
	return nil
}
