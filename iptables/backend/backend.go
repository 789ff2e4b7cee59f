// Package backend chooses the applier for a mode, including "auto", and keeps one backend's rules
// in a namespace at a time. It decides nothing about which rules exist; that is the builder's job.
package backend

import "github.com/kubemesh/proxy-init/iptables"

// Aliases so callers can name everything about backends from this package.
type (
	Applier     = iptables.Applier
	Result      = iptables.Result
	State       = iptables.State
	FamilyState = iptables.FamilyState
)
