// Package validator is the network validator: an init container that proves, from inside a pod,
// that the proxy redirect really works before the application starts. It is Linkerd's
// linkerd-network-validator, command line and exit code included, run as `proxy-init validate`.
//
// How it works: it listens on the outbound proxy port (--listen-addr, default 0.0.0.0:4140),
// connects to an address nothing answers (--connect-addr, default 192.0.2.2:1404 as in Linkerd,
// whose chart passes 1.1.1.1:20001) and expects that connection to land on its own listener. The client sends a random token, the listener
// echoes it, and the listener checks with SO_ORIGINAL_DST that the connection was NATed from the
// connect address. Beyond Linkerd it can also check IPv6 (--ipv6) and that the proxy's own UID is
// NOT redirected (--proxy-uid), which would make the proxy loop into itself.
//
// Exit codes: 0 when every check passed; 95 (ExitRedirectFailed) when the redirect does not work,
// with a message saying what failed; 2 for bad flags; 1 for anything else (for example the listen
// port already taken), which says nothing about the redirect.
//
// The connect address is never really contacted: every validator socket has an IP TTL (IPv6 hop
// limit) of 1, so an unredirected SYN dies at the first router, the node. Only an address on the
// pod's own link would be reached; the defaults never are.
//
// Limits:
//   - It runs as UID 65534 with no capabilities; listening on 4140 needs none. The proxy UID
//     check needs to switch a thread to that UID (root or CAP_SETUID); without that privilege it
//     is skipped and the log says so.
//   - It must run in the pod's network namespace (it has no --netns): every socket it opens is
//     created by whichever thread runs it.
//   - Addresses are IP literals with a port; host names are refused, so no DNS is needed.
//   - It proves TCP redirection only; it does not talk to the proxy (which has not started yet).
//
// # Tests
//
// As root: a pass with rules applied through runner.Runner for iptables-legacy, iptables-nft and
// nftables, over IPv4, IPv6, a dual-stack listener and --ipv6; exit 95 with no rules, with only the
// inbound rules, and for --ipv6 with IPv4-only rules; the token mismatch; the wrong original
// destination; a destination rewritten before the rules (Cilium's socket-LB, stood in for by an
// nftables rewrite ahead of conntrack); the proxy UID check (exempt, not exempt, skipped without
// privilege); exit codes 1 and 2; hop limit 1.
package validator
