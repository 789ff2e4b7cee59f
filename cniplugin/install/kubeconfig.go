package install

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/kubemesh/proxy-init/internal/kubeconfig"
)

// kubeconfigMode keeps the token root's alone (Linkerd's 0644 hands it to every local user).
const kubeconfigMode fs.FileMode = 0o600

// renderKubeconfig returns the plugin's kubeconfig from the service account token and CA. Both must
// exist and be non-empty: else every pod sandbox creation on the node fails later, far from here.
func renderKubeconfig(c *Config) ([]byte, error) {
	tokenPath := filepath.Join(c.ServiceAccountDir, "token")
	token, err := os.ReadFile(tokenPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("service account token %s does not exist: "+
			"is automountServiceAccountToken disabled for the DaemonSet's pods?", tokenPath)
	} else if err != nil {
		return nil, fmt.Errorf("read service account token: %w", err)
	}
	token = bytes.TrimSpace(token)
	if len(token) == 0 {
		return nil, fmt.Errorf("service account token %s is empty", tokenPath)
	}
	for _, b := range token {
		if b < 0x21 || b > 0x7e {
			return nil, fmt.Errorf("service account token %s holds a non-printable byte 0x%02x", tokenPath, b)
		}
	}
	p := kubeconfig.Params{Server: c.serverURL(), Token: string(token), InsecureSkipTLSVerify: c.SkipTLSVerify}
	if !c.SkipTLSVerify {
		if p.CA, err = os.ReadFile(c.KubeCAFile); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("API server CA file %s does not exist (set KUBE_CA_FILE)", c.KubeCAFile)
		} else if err != nil {
			return nil, fmt.Errorf("read API server CA: %w", err)
		}
		if len(bytes.TrimSpace(p.CA)) == 0 {
			return nil, fmt.Errorf("API server CA file %s is empty", c.KubeCAFile)
		}
		if !bytes.Contains(p.CA, []byte("-----BEGIN CERTIFICATE-----")) {
			return nil, fmt.Errorf("API server CA file %s holds no PEM certificate", c.KubeCAFile)
		}
	}
	return kubeconfig.Render(p), nil
}
