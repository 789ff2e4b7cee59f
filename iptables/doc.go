// Package iptables is the one rule builder shared by proxy-init, the CNI plugin, CHECK, cleanup,
// --simulate and show.
//
// It is pure: a Config goes in, is validated as a whole (every problem reported at once), and
// Build turns it into a Ruleset. The Ruleset renders the Linkerd-compatible iptables rules
// (chain names, rule order and "proxy-init/<name>" comments) as iptables-restore payloads per
// address family, and the equivalent nftables table. Inspect goes the other way: from the rules
// read back, it rebuilds the configuration that wrote them and says whether they are whole
// (proxy-init show without rule flags). The package runs no binaries, enters no namespaces and
// logs nothing: appliers in the sub-packages do that, and decide nothing about which rules exist.
//
// # Tests
//
// Without root: TestBuildReportsEveryProblem and TestNumericBounds (every bad value named at once),
// golden payloads and nft scripts (testdata/iptables, testdata/nft; `go test ./iptables -update`
// regenerates them), TestRenderingsAgree (the two renderings of the plan, both directions),
// TestNFTSemantics, compare and transition payloads; fuzzers for port lists (through Build, as
// every front end parses them) and CIDRs (`make fuzz`; testdata/fuzz is their seed corpus).
package iptables
