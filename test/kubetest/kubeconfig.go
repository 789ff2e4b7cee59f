package kubetest

import (
	"fmt"
	"os"

	"github.com/kubemesh/proxy-init/internal/kubeconfig"
)

// WriteKubeconfig writes, with mode 0600, a kubeconfig for this cluster that
// authenticates with token, rendered by the linkerd-cni installer's own
// renderer (internal/kubeconfig): cluster "local" (server Host, CA embedded),
// user "linkerd-cni", context "linkerd-cni-context" as current context. A
// process reading it must run in the cluster's network namespace to reach Host.
func (c *Cluster) WriteKubeconfig(path, token string) error {
	data := kubeconfig.Render(kubeconfig.Params{Server: c.Host, Token: token, CA: c.CAData})
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig %s: %w", path, err)
	}
	// WriteFile keeps the mode of an existing file; the token must not leak.
	if err := os.Chmod(path, 0o600); err != nil {
		return fmt.Errorf("chmod kubeconfig %s: %w", path, err)
	}
	return nil
}

// WriteAdminKubeconfig writes a kubeconfig like WriteKubeconfig's for the
// admin (system:masters) user, for components such as a kube-scheduler or a
// kubelet started next to the cluster.
func (c *Cluster) WriteAdminKubeconfig(path string) error {
	return c.WriteKubeconfig(path, c.adminToken)
}
