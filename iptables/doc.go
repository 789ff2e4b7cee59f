// Package iptables is the one rule builder shared by proxy-init, the CNI plugin, CHECK, cleanup,
// --simulate and show.
//
// It is pure: Build validates a Config as a whole (every problem reported at once) and turns it
// into a Ruleset, which renders the Linkerd-compatible iptables rules (chain names, rule order and
// "proxy-init/<name>" comments) as iptables-restore payloads per family, and the equivalent
// nftables table. Inspect goes the other way, from the rules read back to their configuration.
// It runs no binaries, enters no namespaces and logs nothing: the appliers in the sub-packages do.
//
// # Tests
//
// Without root: every bad value named at once, golden payloads and nft scripts (`go test
// ./iptables -update` regenerates them), the two renderings agreeing, and fuzzers (`make fuzz`).
package iptables
