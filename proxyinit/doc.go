// Package proxyinit is the proxy-init command: it turns a Linkerd-compatible command line into an
// iptables.Config, validates all of it before touching anything, and then applies, shows or
// removes the rules inside the pod's network namespace, or only prints them (--simulate).
//
// cmd/proxy-init is a one-line main around Main; every decision lives here so it can be unit
// tested without building a binary.
//
// Contract: the flag names, shorthands and defaults are Linkerd's (docs/linkerd-compatibility.md),
// so the Linkerd chart's command line parses unchanged; the one deliberate difference is
// --iptables-mode, which defaults to auto instead of legacy. Exit codes: 0 success, 1 failure,
// 2 bad usage or input. Bad input is reported all at once, each problem naming the flag and the
// value, and nothing is written: validation runs before a namespace is entered or a backend
// chosen.
//
// Limits: --firewall-bin-path and --firewall-save-bin-path only select the mode from their base
// names (iptables-legacy*, iptables-nft*, iptables); the binaries themselves are looked up in
// PATH by the backend, not at the given path. The rule logic, the backends and namespace entry
// live in iptables, iptables/runner and internal/netnsutil; this package only wires them.
//
// # Tests
//
// Without root: Linkerd's command lines parse, bad input, help, the flag defaults (TestDefaults),
// the exact --simulate payloads and batches (golden, testdata/simulate-*.txt; `go test ./proxyinit
// -update`), the show report, and that Main changes nothing process-wide
// (TestMainLeavesTheProcessAlone). The binary's own tests are cmd/proxy-init's.
package proxyinit
