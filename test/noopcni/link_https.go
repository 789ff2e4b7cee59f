//go:build linkhttps

package main

// Built with -tags linkhttps, the no-op plugin also links Go's HTTPS client as a plugin that reads
// the Kubernetes API uses it (a GET over TLS, trusting a CA from a PEM file, decoding JSON), and
// initialises its packages: the benchmark's start-up floor for such a plugin, whatever client it
// uses. The GET is linked, not run: only NOOPCNI_GET, which nothing sets, would run it.

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
)

func init() {
	url := os.Getenv("NOOPCNI_GET")
	if url == "" {
		return
	}
	pool := x509.NewCertPool()
	if pem, err := os.ReadFile(os.Getenv("NOOPCNI_CA")); err == nil {
		pool.AppendCertsFromPEM(pem)
	}
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	resp, err := c.Get(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	var v map[string]any
	fmt.Println(json.NewDecoder(resp.Body).Decode(&v), v)
}
