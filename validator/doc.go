// Package validator is the network validator, Linkerd's linkerd-network-validator (command line
// and exit code included) run as `proxy-init validate`: an init container that proves, from inside
// a pod, that the proxy redirect works before the application starts. It listens on the outbound proxy port (--listen-addr, default 0.0.0.0:4140),
// connects to an address nothing answers (--connect-addr, default 192.0.2.2:1404 as in Linkerd)
// and expects that connection to land on its own listener: the client sends a random token, the
// listener echoes it and checks with SO_ORIGINAL_DST that the connection was NATed from the
// connect address. Beyond Linkerd it can check IPv6 (--ipv6) and that the proxy's own UID is NOT
// redirected (--proxy-uid). Exit codes: 0 every check passed; 95 (ExitRedirectFailed) the redirect
// does not work; 2 bad flags; 1 anything else, which says nothing about the redirect.
//
// The connect address is never contacted: every socket has an IP TTL (IPv6 hop limit) of 1, so an
// unredirected SYN dies at the node. Limits: the proxy UID check needs root or CAP_SETUID, else it is skipped with a log line; it
// runs in the pod's network namespace only (no --netns); addresses are IP literals, so no DNS;
// it proves TCP redirection only, without the proxy (not started yet).
//
// # Tests
//
// As root, with rules written through runner.Runner in every backend: each check's pass and each
// failure reason over IPv4, IPv6 and dual stack, the proxy UID check, the exit codes, hop limit 1.
package validator
