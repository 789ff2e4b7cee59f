// Package nfnl is the one package that speaks nf_tables netlink. It holds:
//
//   - the socket: one NETLINK_NETFILTER socket per call (mdlayher/netlink), in the calling
//     thread's network namespace (enter it first, internal/netnsutil), closed before returning;
//   - the batch: one transaction, checked against the ruleset generation it was planned at (the
//     kernel refuses it whole if the ruleset changed since the read, and the applier reads and
//     plans again), acknowledged on its last message only, describing every message, so an error
//     names the refused message and the batch prints itself (what --simulate shows);
//   - the one read of kernel state: the generation and every table (with the native table's
//     comment) in one round trip, then chains, rules, sets and elements of our tables only;
//   - the two encodings of our rules, both ways: iptables-nft's ("ip nat" and "ip6 nat", every
//     match, target and comment exactly as iptables-nft-restore writes them, so `iptables -t nat
//     -S` shows them and iptables-nft-save prints them byte for byte as its own) and the native
//     "inet proxy_init" table (ports and subnets in sets);
//   - the planner, which turns a state and a target into one batch: one representation written
//     and ours removed from the other, or both removed;
//   - the applier (New), covering iptables-nft's rules (the nft mode, auto's first choice), the
//     native table (the nftables mode), or both.
//
// It renders the builder's rules (iptables.Ruleset.XTRules and NFT) and decides nothing about
// which rules exist. A rule read back counts as ours only if it is exactly one the encoding writes.
//
// Laid out here because no library covers it: the batch framing (google/nftables' Conn.Flush
// sends no generation, acknowledges every message and does not say which failed); the messages'
// attributes, with mdlayher/netlink's decoder (google/nftables' Conn writes and reads no table
// comment, where the native table records its plan, sets NFTA_RULE_COMPAT_PROTO only for some
// matches, not multiport, which refuses a rule without it, and skips expressions it does not
// know); and the owner, multiport, TPROXY and CT infos, which google/nftables' xt has no type for.
// The expressions, the REDIRECT, conntrack and comment infos are google's and so is their
// decoding. It marshals the expressions all rules share once per process; the xtables matches and
// targets and the comparisons, which each rule holds its own of, are written straight into the
// batch as it lays them out (TestExpressionsAsGoogleMarshals holds them equal), because its
// marshalling allocates each anew, the 256-byte comment three times over: with a thousand rules
// that made iptables-nft mode slower than the hand-laid encoder this package replaced.
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
// extension blobs in TestInfoBlobsAsIPTablesNFT, TestExpressionsAsGoogleMarshals), the batch per
// config for a fresh namespace (TestGoldenBatches, testdata/batch), and the planner from kernel
// states recorded in real namespaces (TestPlanFromRecordedStates, testdata/states: leftovers,
// another tool's rules, a tampered table, both representations; `-update` regenerates the
// batches, `-run TestRecordStates -record` as root the states). As root: for every golden config
// and family, iptables-nft-save prints the same after our apply as after iptables-nft-restore of
// our payload (TestSaveEquality), and `iptables-nft -S` / `-L` read it; iptables-nft-restore over
// our rules and our apply over its rules; others' rules untouched; all or nothing; a stale plan
// refused whole (TestStalePlanRefused); the native table: apply, show, re-apply, cleanup, `nft -f`
// of the same table and of the printed batch, one transaction per change, a tampered table
// repaired, a refused batch writes nothing and names the message, iptables-nft rules of ours
// removed in the same batch, an empty PATH, large sets, concurrent applies; real traffic.
package nfnl
