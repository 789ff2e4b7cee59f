// Package nfnl is the one package that speaks nf_tables netlink. It holds:
//
//   - the socket: one NETLINK_NETFILTER socket per call (mdlayher/netlink), in the calling
//     thread's network namespace (enter it first, internal/netnsutil), closed before returning;
//   - the batch: one transaction, checked against the ruleset generation it was planned at
//     (the kernel refuses it whole if anything changed the ruleset since the read, and the
//     applier reads and plans again), acknowledged on its last message only, with a description
//     of every message, so an error names the message the kernel refused and the batch prints
//     itself (what --simulate shows);
//   - the one read of kernel state: the generation and every table (with the native table's
//     comment) in one round trip, then chains, rules, sets and elements only of the tables of
//     ours that exist;
//   - the two encodings of our rules, both ways: iptables-nft's (the "ip nat" and "ip6 nat"
//     tables, every match, target and comment exactly as iptables-nft-restore writes them, so
//     that `iptables -t nat -S` shows them and iptables-nft-save prints them byte for byte as
//     its own) and the native "inet proxy_init" table (ports and subnets in sets);
//   - the planner, which turns a state and a target into one batch: one representation written
//     and ours removed from the other, or both removed;
//   - the applier (New), which covers one or both representations: iptables-nft's rules, the
//     nft mode and auto's first choice, and the native table, the nftables mode.
//
// It renders the builder's rules (iptables.Ruleset.XTRules and NFT) and decides nothing about
// which rules exist. A rule read back counts as ours only if it is exactly one the encoding
// writes.
//
// What is laid out here because no library covers it: the batch framing (google/nftables'
// Conn.Flush sends no generation, acknowledges every message and does not say which message
// failed), the messages' attributes, for which mdlayher/netlink's attribute encoder and decoder
// are used (google/nftables' Conn writes no table comment, where the native table records its
// plan, and sets NFTA_RULE_COMPAT_PROTO only for some xtables matches, not for multiport, which
// refuses a rule without it), the decoding of dumps (google/nftables' Conn reads no table
// comment and skips expressions it does not know), and the owner and multiport matches' info
// structs, for which google/nftables' xt package has no type. The expressions are google's
// (expr), and so are the REDIRECT infos (xt.NatIPv4MultiRangeCompat, xt.NatRange) and the
// comment's type (xt.Comment); google/nftables marshals every expression, those all rules share
// once per process, except the three kinds each rule holds its own of: the xtables matches and
// targets and the comparisons are written straight into the batch, as google/nftables lays them
// out (a test holds every expression of every golden rule byte for byte equal to its marshalling),
// because its marshalling allocates each anew, the 256-byte comment three times over, and with a
// thousand rules that made iptables-nft mode slower than the hand-laid encoder this package
// replaced. Every expression read back is decoded by google/nftables.
//
// Limits: it needs CAP_NET_ADMIN in the namespace (a *iptables.CapabilityError otherwise) and a
// kernel with nf_tables and, for iptables-nft's rules, nft_compat with the xt_owner, xt_multiport,
// xt_comment and xt_REDIRECT extensions, which iptables-nft needs too; for the native table, nat
// chains and the redir expression (an error wrapping iptables.ErrUnsupported otherwise). It cannot
// see iptables-legacy rules, which live outside nf_tables. Table comments need Linux 5.13 or
// later; an older kernel drops the native table's comment, so every apply there rewrites the
// table (still in one transaction).
//
// # Tests
//
// Without root: the encodings both ways (TestDecodeIsStrictInverse, TestNativeRoundTrip, the
// extension blobs pinned in TestInfoBlobsAsIPTablesNFT, the expressions laid into the batch held
// equal to google/nftables' marshalling in TestExpressionsAsGoogleMarshals), the batch per config
// for a fresh namespace (TestGoldenBatches, testdata/batch), and the planner from kernel states
// recorded in real namespaces (TestPlanFromRecordedStates, testdata/states: leftovers, another
// tool's rules, a tampered table, both representations at once; `-update` regenerates the batches,
// `-run TestRecordStates -record` as root the states). As root: for every golden config and both
// families, iptables-nft-save prints the same after our apply as after iptables-nft-restore of our
// payload (TestSaveEquality), and `iptables-nft -S` / `-L` read it; iptables-nft-restore over our
// rules and our apply over its rules; others' rules untouched; all or nothing; a stale plan refused
// whole (TestStalePlanRefused, both representations); the native table: apply, show, re-apply and
// cleanup, `nft -f` of the same table and of the printed batch, one transaction per change, a
// tampered table repaired, a refused batch writes nothing and names the message, iptables-nft rules
// of ours removed in the same batch, an empty PATH, large sets, concurrent applies; real traffic.
package nfnl
