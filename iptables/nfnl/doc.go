// Package nfnl is the one package that speaks nf_tables netlink. It holds:
//
//   - the socket: one NETLINK_NETFILTER socket per call (mdlayher/netlink), in the calling
//     thread's network namespace (enter it first, internal/netnsutil), closed before returning;
//   - the batch: one transaction, checked against the ruleset generation it was planned at (the
//     kernel refuses it whole if the ruleset changed since the read, and the applier reads and
//     plans again), acknowledged on its last message only, describing every message, so an error
//     names the refused message and the batch prints itself (what --simulate shows);
//   - the one read of kernel state: the generation and every table in one round trip, then
//     chains, rules, sets and elements of our tables only;
//   - the two encodings of our rules, both ways: iptables-nft's (exactly as iptables-nft-restore
//     writes them, so iptables-nft-save prints them byte for byte as its own) and the native
//     "inet proxy_init" table (ports and subnets in sets);
//   - the planner, which turns a state and a target into one batch, and the applier (New),
//     covering iptables-nft's rules, the native table, or both.
//
// It renders the builder's rules (iptables.Ruleset.XTRules and NFT) and decides nothing about
// which rules exist. A rule read back counts as ours only if it is exactly one the encoding writes.
//
// Laid out here because no library covers it: the batch framing (google/nftables' Conn.Flush
// sends no generation, acknowledges every message and does not say which failed); the messages'
// attributes (google/nftables' Conn writes and reads no table comment, where the native table
// records its plan, sets NFTA_RULE_COMPAT_PROTO only for some matches, not multiport, which
// refuses a rule without it, and skips expressions it does not know); and the owner, multiport,
// TPROXY and CT infos, which google/nftables' xt has no type for. The expressions and the other
// infos are google's, marshalled once per process where all rules share them; the xtables
// matches and targets and the comparisons are written straight into the batch
// (TestExpressionsAsGoogleMarshals holds them equal): google's marshalling allocates each anew,
// which with a thousand rules made iptables-nft mode slower than the encoder it replaced.
//
// Limits: it needs CAP_NET_ADMIN in the namespace (a *iptables.CapabilityError otherwise) and a
// kernel with nf_tables and, for iptables-nft's rules, nft_compat with the xt_owner, xt_multiport,
// xt_comment and xt_REDIRECT extensions, as iptables-nft does; for the native table, nat chains
// and the redir expression (an error wrapping iptables.ErrUnsupported otherwise). It cannot see
// iptables-legacy rules. Table comments need Linux 5.13: an older kernel drops the native
// table's, so every apply there rewrites the table (still in one transaction).
//
// # Tests
//
// Without root: the encodings both ways, the batch per config for a fresh namespace
// (testdata/batch) and the planner from kernel states recorded in real namespaces
// (testdata/states); `-update` regenerates the batches, `-run TestRecordStates -record` as root
// the states. As root: iptables-nft-save prints the same after our apply as after
// iptables-nft-restore of our payload (TestSaveEquality); others' rules untouched; all or
// nothing; a stale plan refused whole; the native table applied, shown, repaired and cleaned up,
// as `nft -f` writes it; real traffic.
package nfnl
