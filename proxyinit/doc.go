// Package proxyinit is the proxy-init command: it turns a Linkerd-compatible command line into an
// iptables.Config, validates all of it, and then applies, shows or removes the rules in the pod's
// network namespace, or only prints them (--simulate). cmd/proxy-init is a main around Main.
// Contract: the flag names, shorthands and defaults are Linkerd's (docs/linkerd-compatibility.md)
// but --iptables-mode, which defaults to auto instead of legacy. Exit codes: 0 success, 1
// failure, 2 bad usage or input, all reported at once before anything is entered or written.
//
// Limits: --firewall-bin-path and --firewall-save-bin-path only select the mode from their base
// names; the backend looks the binaries up in PATH.
//
// # Tests
//
// Without root: Linkerd's command lines parse, bad input, help, the flag defaults, the exact
// --simulate payloads and batches (golden, testdata/simulate-*.txt), the show report, and that
// Main changes nothing process-wide. The binary's own tests are cmd/proxy-init's.
package proxyinit
