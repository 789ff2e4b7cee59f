//go:build linkhttps

package main

// Built with -tags linkhttps, the no-op plugin also initialises Go's HTTPS client stack, which
// any plugin that reads the Kubernetes API must link: the benchmark's start-up floor for such a
// plugin, whatever client it uses.
import _ "net/http"
