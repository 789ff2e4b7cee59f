package kubeconfig

import (
	"bytes"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
)

// TestRender loads the rendered file with client-go, as the plugin does, and checks that every
// value survives, including ones that would break a naively quoted YAML document.
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
