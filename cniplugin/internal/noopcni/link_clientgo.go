//go:build linkclientgo

package main

// Built with -tags linkclientgo, the no-op plugin also initialises the parts of client-go that
// linkerd-cni's companion (linkerd-cni-api) needs to read a kubeconfig and GET a pod: the
// benchmark's start-up floor for a plugin that uses client-go at all.
import (
	_ "k8s.io/client-go/rest"
	_ "k8s.io/client-go/tools/clientcmd"
)
