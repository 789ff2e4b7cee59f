package kubeconfig

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// TestRender loads the rendered file with client-go, as kubectl does, and checks that every value
// survives, including ones that would break a naively quoted document.
func TestRender(t *testing.T) {
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	tests := []struct {
		name string
		p    Params
	}{
		{"ipv4 with CA", Params{Server: "https://192.0.2.1:443", Token: "abc.def-ghi", CA: ca}},
		{"ipv6 with CA", Params{Server: "https://[2001:db8::1]:6443", Token: "tok", CA: ca}},
		{"insecure", Params{Server: "https://203.0.113.5:443", Token: "tok", CA: ca, InsecureSkipTLSVerify: true}},
		{"hostile values", Params{Server: "https://192.0.2.1:443/#: x", Token: "a\"b'c: d\n# e", CA: ca}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := clientcmd.Load(Render(tc.p))
			if err != nil {
				t.Fatalf("load rendered kubeconfig: %v\n%s", err, Render(tc.p))
			}
			if cfg.CurrentContext != Context {
				t.Fatalf("current-context %q, want %q", cfg.CurrentContext, Context)
			}
			kctx, ok := cfg.Contexts[Context]
			if !ok || kctx.Cluster != Cluster || kctx.AuthInfo != User {
				t.Fatalf("context %+v, want cluster %q, user %q", kctx, Cluster, User)
			}
			cl, user := cfg.Clusters[Cluster], cfg.AuthInfos[User]
			if cl == nil || user == nil {
				t.Fatalf("cluster %v, user %v; want both", cl, user)
			}
			if cl.Server != tc.p.Server || user.Token != tc.p.Token {
				t.Fatalf("server %q, token %q; want %q, %q", cl.Server, user.Token, tc.p.Server, tc.p.Token)
			}
			if tc.p.InsecureSkipTLSVerify {
				if !cl.InsecureSkipTLSVerify || len(cl.CertificateAuthorityData) != 0 {
					t.Fatalf("insecure %v, CA %q; want insecure and no CA", cl.InsecureSkipTLSVerify, cl.CertificateAuthorityData)
				}
			} else if cl.InsecureSkipTLSVerify || !bytes.Equal(cl.CertificateAuthorityData, tc.p.CA) {
				t.Fatalf("insecure %v, CA %q; want the CA embedded", cl.InsecureSkipTLSVerify, cl.CertificateAuthorityData)
			}
		})
	}
}

// TestRead reads what Render writes, and what an operator may write instead (the CA and the
// token in files), into the same Params.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	ca := []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
	write := func(name, content string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	caFile, tokenFile := write("ca.crt", string(ca)), write("token", "tok\n")
	want := Params{Server: "https://[2001:db8::1]:6443", Token: "tok", CA: ca}
	for name, content := range map[string]string{
		"rendered": string(Render(want)),
		"files": `{"apiVersion":"v1","kind":"Config","preferences":{},"current-context":"other",
 "clusters":[{"name":"other","cluster":{"server":"https://192.0.2.9"}},{"name":"local","cluster":{"server":"https://[2001:db8::1]:6443","certificate-authority":"` + caFile + `"}}],
 "users":[{"name":"linkerd-cni","user":{"tokenFile":"` + tokenFile + `"}}],
 "contexts":[{"name":"linkerd-cni-context","context":{"cluster":"local","user":"linkerd-cni","namespace":"x"}}]}`,
	} {
		t.Run(name, func(t *testing.T) {
			got, err := Read(write(name, content))
			if err != nil {
				t.Fatal(err)
			}
			if got.Server != want.Server || got.Token != want.Token || !bytes.Equal(got.CA, want.CA) || got.InsecureSkipTLSVerify {
				t.Errorf("Read = %+v, want %+v", got, want)
			}
		})
	}
}
