// Package multicall maps the names Linkerd gives its binaries to our programs, so that a copy or
// link under one of those names runs Linkerd's command line as it is (no subcommand). Limits:
// only argv[0]'s base name counts; standard library only (the lean plugin links it).
package multicall

import (
	"fmt"
	"path/filepath"
)

// Programs, as their binaries are called in our images.
const (
	ProxyInit  = "proxy-init"
	LinkerdCNI = "linkerd-cni"
)

// Name is one name a binary answers to.
type Name struct {
	Name       string // the base name of argv[0]
	Program    string // the binary that serves it
	Subcommand string // put before the arguments ("" for none)
}

// Names are Linkerd's names our binaries answer to (in its /usr/lib/linkerd, or /usr/bin).
var Names = []Name{
	{"linkerd2-proxy-init", ProxyInit, ""},                  // proxy-init, from the proxy image
	{"linkerd2-network-validator", ProxyInit, "validate"},   // the validator, from the proxy image
	{"linkerd-network-validator", ProxyInit, "validate"},    // the validator's release name
	{"linkerd-cni-repair-controller", LinkerdCNI, "repair"}, // from the cni-plugin image
	{"linkerd2-cni-install", LinkerdCNI, "install"},         // the cni-plugin image's CMD
}

// Args returns the arguments program runs with when started as argv: argv[1:], after the
// subcommand argv[0]'s name stands for unless they start with it; the other program's is an error.
func Args(program string, argv []string) ([]string, error) {
	if len(argv) == 0 {
		return nil, nil
	}
	args := argv[1:]
	base := filepath.Base(argv[0])
	for _, n := range Names {
		if n.Name != base {
			continue
		}
		if n.Program != program {
			return nil, fmt.Errorf("%s is a name of the %s binary, not of %s: install %s under it", base, n.Program, program, n.Program)
		}
		if n.Subcommand == "" || (len(args) > 0 && args[0] == n.Subcommand) {
			return args, nil
		}
		return append([]string{n.Subcommand}, args...), nil
	}
	return args, nil
}
