// Package kubeconfig is the kubeconfig the linkerd-cni plugin reads: the JSON file `linkerd-cni
// install` writes beside the node's CNI configuration, in Linkerd's shape (cluster "local", user
// "linkerd-cni", context "linkerd-cni-context"), with a bearer token. Render writes it (so do the
// tests' kube-apiserver harness); Read reads it back, refusing what the plugin's client cannot
// honour: anything but JSON, a token or token file and an https server.
//
// Limits: writing the file with a safe mode is the caller's job. Standard library only: the
// plugin links this package.
package kubeconfig

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"os"
	"slices"
	"strings"
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

// The parts of a kubeconfig, with the keys kubectl writes. Read refuses unknown fields, so that a
// setting it would silently ignore (a proxy, an impersonation) is an error instead.
type (
	file struct {
		APIVersion     string          `json:"apiVersion,omitempty"`
		Kind           string          `json:"kind,omitempty"`
		Clusters       []named         `json:"clusters"`
		Users          []named         `json:"users"`
		Contexts       []named         `json:"contexts"`
		CurrentContext string          `json:"current-context,omitempty"`
		Preferences    json.RawMessage `json:"preferences,omitempty"`
	}
	named struct {
		Name    string          `json:"name"`
		Cluster json.RawMessage `json:"cluster,omitempty"`
		User    json.RawMessage `json:"user,omitempty"`
		Context json.RawMessage `json:"context,omitempty"`
	}
	cluster struct {
		Server                   string `json:"server"`
		CertificateAuthorityData []byte `json:"certificate-authority-data,omitempty"`
		CertificateAuthority     string `json:"certificate-authority,omitempty"`
		InsecureSkipTLSVerify    bool   `json:"insecure-skip-tls-verify,omitempty"`
	}
	user struct {
		Token     string `json:"token,omitempty"`
		TokenFile string `json:"tokenFile,omitempty"`
	}
	kubeContext struct {
		Cluster   string `json:"cluster"`
		User      string `json:"user"`
		Namespace string `json:"namespace,omitempty"`
	}
)

// Render returns the kubeconfig, as indented JSON.
func Render(p Params) []byte {
	c := cluster{Server: p.Server, CertificateAuthorityData: p.CA}
	if p.InsecureSkipTLSVerify {
		c = cluster{Server: p.Server, InsecureSkipTLSVerify: true}
	}
	raw := func(v any) json.RawMessage {
		b, _ := json.Marshal(v)
		return b
	}
	b, _ := json.MarshalIndent(file{
		APIVersion: "v1", Kind: "Config", CurrentContext: Context,
		Clusters: []named{{Name: Cluster, Cluster: raw(c)}},
		Users:    []named{{Name: User, User: raw(user{Token: p.Token})}},
		Contexts: []named{{Name: Context, Context: raw(kubeContext{Cluster: Cluster, User: User})}},
	}, "", "  ")
	return append(b, '\n')
}

// refusedUser are the ways to authenticate the plugin does not take, with why (made when read).
func refusedUser() map[string]string {
	return map[string]string{
		"exec":                    "a credential plugin is not run by the CNI plugin: use token or tokenFile",
		"auth-provider":           "an auth provider is not run by the CNI plugin: use token or tokenFile",
		"client-certificate":      "client certificates are not supported: use token or tokenFile",
		"client-certificate-data": "client certificates are not supported: use token or tokenFile",
		"client-key":              "client certificates are not supported: use token or tokenFile",
		"client-key-data":         "client certificates are not supported: use token or tokenFile",
		"username":                "basic authentication is not supported: use token or tokenFile",
		"password":                "basic authentication is not supported: use token or tokenFile",
	}
}

// Read reads the kubeconfig at path and returns the server, token and CA of its context Context
// (not its current-context: the file may be shared). Files it names (certificate-authority,
// tokenFile) are read too. Every error names path and the field.
func Read(path string) (_ Params, err error) {
	defer func() {
		if err != nil {
			err = fmt.Errorf("kubeconfig %s: %w", path, err)
		}
	}()
	data, err := os.ReadFile(path)
	if err != nil {
		return Params{}, err
	}
	if t := bytes.TrimSpace(data); len(t) == 0 || t[0] != '{' {
		return Params{}, errors.New("not JSON: linkerd-cni install writes the plugin's kubeconfig as JSON, and the plugin reads no other form (YAML included)")
	}
	var f file
	if err := strict(data, "", &f, nil); err != nil {
		return Params{}, err
	}
	var kc kubeContext
	if err := pick(f.Contexts, "contexts", Context, "context", func(n named) json.RawMessage { return n.Context }, &kc, nil); err != nil {
		return Params{}, err
	}
	var c cluster
	if err := pick(f.Clusters, "clusters", kc.Cluster, "cluster", func(n named) json.RawMessage { return n.Cluster }, &c, nil); err != nil {
		return Params{}, err
	}
	var u user
	if err := pick(f.Users, "users", kc.User, "user", func(n named) json.RawMessage { return n.User }, &u, refusedUser()); err != nil {
		return Params{}, err
	}
	return resolve(c, u, "clusters["+kc.Cluster+"].cluster", "users["+kc.User+"].user")
}

// pick decodes the entry called name of list (in field key of the entry) into v.
func pick(list []named, what, name, key string, part func(named) json.RawMessage, v any, refused map[string]string) error {
	i := slices.IndexFunc(list, func(n named) bool { return n.Name == name })
	if i < 0 {
		return fmt.Errorf("%s: no entry named %q", what, name)
	}
	where := what + "[" + name + "]." + key
	if len(part(list[i])) == 0 {
		return fmt.Errorf("%s: missing", where)
	}
	return strict(part(list[i]), where, v, refused)
}

// strict decodes data into v, refusing unknown fields and, with why, the refused ones.
func strict(data []byte, where string, v any, refused map[string]string) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(data, &keys); err != nil {
		return fmt.Errorf("%s: %w", cmp.Or(where, "document"), err)
	}
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if why, ok := refused[k]; ok {
			return fmt.Errorf("%s.%s: %s", where, k, why)
		}
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%s: %w", cmp.Or(where, "document"), err)
	}
	return nil
}

// resolve checks the cluster and user and reads the files they name.
func resolve(c cluster, u user, cw, uw string) (Params, error) {
	p := Params{Server: c.Server, Token: u.Token, CA: c.CertificateAuthorityData, InsecureSkipTLSVerify: c.InsecureSkipTLSVerify}
	if err := CheckServer(c.Server); err != nil {
		return Params{}, fmt.Errorf("%s.server: %w", cw, err)
	}
	if c.CertificateAuthority != "" {
		if len(p.CA) > 0 {
			return Params{}, fmt.Errorf("%s: both certificate-authority and certificate-authority-data are set", cw)
		}
		ca, err := os.ReadFile(c.CertificateAuthority)
		if err != nil {
			return Params{}, fmt.Errorf("%s.certificate-authority: %w", cw, err)
		}
		p.CA = ca
	}
	switch {
	case p.InsecureSkipTLSVerify && len(p.CA) > 0:
		return Params{}, fmt.Errorf("%s: insecure-skip-tls-verify with a certificate authority", cw)
	case !p.InsecureSkipTLSVerify && len(p.CA) == 0:
		return Params{}, fmt.Errorf("%s: no certificate-authority-data, certificate-authority or insecure-skip-tls-verify", cw)
	}
	switch {
	case u.Token != "" && u.TokenFile != "":
		return Params{}, fmt.Errorf("%s: both token and tokenFile are set", uw)
	case u.TokenFile != "":
		b, err := os.ReadFile(u.TokenFile)
		if err != nil {
			return Params{}, fmt.Errorf("%s.tokenFile: %w", uw, err)
		}
		p.Token = strings.TrimSpace(string(b))
	}
	if p.Token == "" {
		return Params{}, fmt.Errorf("%s: no token or tokenFile", uw)
	}
	return p, nil
}

// CheckServer refuses an API server URL the plugin must not send its token to: anything but
// https with a host.
func CheckServer(server string) error {
	u, err := url.Parse(server)
	switch {
	case err != nil:
		return err
	case u.Scheme != "https":
		return fmt.Errorf("%q is not an https URL: the token goes over TLS only", server)
	case u.Host == "":
		return fmt.Errorf("%q has no host", server)
	}
	return nil
}
