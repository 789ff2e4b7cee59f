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

// kubeconfigMode keeps the token readable by root only; Linkerd writes
// 0644 and so hands the token to every local user.
const kubeconfigMode fs.FileMode = 0o600

// credentials are what the kubeconfig is made of.
type credentials struct {
	token []byte
	ca    []byte // nil with SkipTLSVerify
}

// readCredentials reads the service account token and the CA. Both must
// exist and be non-empty: a kubeconfig without them would only make every
// pod sandbox creation on the node fail later, far from the cause.
func readCredentials(c *Config) (credentials, error) {
	tokenPath := filepath.Join(c.ServiceAccountDir, "token")
	token, err := os.ReadFile(tokenPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return credentials{}, fmt.Errorf("service account token %s does not exist: "+
				"is automountServiceAccountToken disabled for the DaemonSet's pods?", tokenPath)
		}
		return credentials{}, fmt.Errorf("read service account token: %w", err)
	}
	token = bytes.TrimSpace(token)
	if len(token) == 0 {
		return credentials{}, fmt.Errorf("service account token %s is empty", tokenPath)
	}
	for _, b := range token {
		if b < 0x21 || b > 0x7e {
			return credentials{}, fmt.Errorf("service account token %s holds a non-printable byte 0x%02x", tokenPath, b)
		}
	}
	cr := credentials{token: token}
	if c.SkipTLSVerify {
		return cr, nil
	}
	ca, err := os.ReadFile(c.KubeCAFile)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return credentials{}, fmt.Errorf("API server CA file %s does not exist (set KUBE_CA_FILE)", c.KubeCAFile)
		}
		return credentials{}, fmt.Errorf("read API server CA: %w", err)
	}
	if len(bytes.TrimSpace(ca)) == 0 {
		return credentials{}, fmt.Errorf("API server CA file %s is empty", c.KubeCAFile)
	}
	if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
		return credentials{}, fmt.Errorf("API server CA file %s holds no PEM certificate", c.KubeCAFile)
	}
	cr.ca = ca
	return cr, nil
}

// renderKubeconfig returns the plugin's kubeconfig.
func renderKubeconfig(c *Config, cr credentials) []byte {
	return kubeconfig.Render(kubeconfig.Params{
		Server:                c.serverURL(),
		Token:                 string(cr.token),
		CA:                    cr.ca,
		InsecureSkipTLSVerify: c.SkipTLSVerify,
	})
}
