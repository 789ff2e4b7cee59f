// Package kubeconfig renders the kubeconfig the linkerd-cni plugin reads: the file `linkerd-cni
// install` writes beside the node's CNI configuration, in Linkerd's shape (cluster "local", user
// "linkerd-cni", context "linkerd-cni-context"), authenticating with a bearer token. The tests'
// kube-apiserver harness writes the same bytes, so what they prove holds for the installer's file.
//
// Limits: rendering only; reading the service account's token and CA, and writing the file with
// a safe mode, are the caller's job.
package kubeconfig

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
)

// Names in the plugin's kubeconfig (docs/linkerd-compatibility.md, "Installer environment").
const (
	Cluster = "local"
	User    = "linkerd-cni"
	Context = "linkerd-cni-context"
)

// Params are what the kubeconfig is made of.
type Params struct {
	Server string // API server URL, e.g. https://[2001:db8::1]:443
	Token  string // bearer token
	CA     []byte // PEM CA bundle, embedded; unused with InsecureSkipTLSVerify
	// InsecureSkipTLSVerify writes insecure-skip-tls-verify instead of the CA.
	InsecureSkipTLSVerify bool
}

// Render returns the kubeconfig. Scalars are written as JSON strings, which YAML reads as
// double-quoted strings, so no value can break the document.
func Render(p Params) []byte {
	q := func(s string) string {
		b, _ := json.Marshal(s)
		return string(b)
	}
	tls := "    certificate-authority-data: " + q(base64.StdEncoding.EncodeToString(p.CA))
	if p.InsecureSkipTLSVerify {
		tls = "    insecure-skip-tls-verify: true"
	}
	return fmt.Appendf(nil, `# Written by linkerd-cni install for the linkerd-cni CNI plugin; removed on uninstall.
apiVersion: v1
kind: Config
clusters:
- name: %[1]s
  cluster:
    server: %[4]s
%[5]s
users:
- name: %[2]s
  user:
    token: %[6]s
contexts:
- name: %[3]s
  context:
    cluster: %[1]s
    user: %[2]s
current-context: %[3]s
`, Cluster, User, Context, q(p.Server), tls, q(p.Token))
}
