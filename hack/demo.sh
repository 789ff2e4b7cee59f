#!/usr/bin/env bash
# make demo: shows what proxy-init does, with real traffic, in two throwaway network namespaces.
#
# A "pod" and a "peer" namespace are joined by a veth pair that is never linked to this
# machine's own network. A fake proxy in the pod reports where each connection it receives was
# originally headed. proxy-init then runs with the Linkerd chart's arguments, and the demo shows
# outbound and inbound connections (IPv4 and IPv6) arriving at the proxy, the proxy's own UID
# and the admin port bypassing it, the rules (`proxy-init show`), and `proxy-init cleanup`.
# Everything is torn down on exit, even on failure or Ctrl-C.
#
# Needs root, Go, iproute2, iptables (nft and legacy) and util-linux's setpriv.
set -euo pipefail

POD=demo-pod
PEER=demo-peer
POD4=192.0.2.10 POD6=2001:db8::10
PEER4=192.0.2.20 PEER6=2001:db8::20
PROXY_UID=2102

if [[ -t 1 ]]; then B=$'\033[1m' D=$'\033[2m' N=$'\033[0m'; else B='' D='' N=''; fi
bold() { printf '\n%s%s%s\n' "$B" "$*" "$N"; }
say() { printf '  %s\n' "$*"; }
run() { printf '  %s$ %s%s\n' "$D" "$*" "$N"; }
die() { printf 'demo: %s\n' "$*" >&2; exit 1; }

[[ $EUID -eq 0 ]] || die "needs root: it creates network namespaces and netfilter rules (try: sudo make demo)"
for tool in go ip nft setpriv iptables-legacy-save; do
	command -v "$tool" >/dev/null || die "$tool is not installed (apt-get install golang iproute2 iptables util-linux)"
done
for ns in "$POD" "$PEER"; do
	[[ ! -e /run/netns/$ns ]] || die "network namespace $ns already exists; remove it with: ip netns del $ns"
done

WORK=$(mktemp -d /tmp/proxy-init-demo.XXXXXX)
chmod 755 "$WORK" # the proxy's UID must be able to run the dial helper
PIDS=()

teardown() {
	local rc=$?
	for pid in "${PIDS[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${PIDS[@]}"; do
		wait "$pid" 2>/dev/null || true
	done
	# Deleting the namespaces also deletes the veth pair and every rule inside them.
	ip netns del "$POD" 2>/dev/null || true
	ip netns del "$PEER" 2>/dev/null || true
	rm -rf "$WORK"
	if [[ $rc -eq 0 ]]; then
		bold "Done: namespaces, veth pair and processes removed."
	else
		printf '\ndemo: failed (exit %d); everything it created has been removed\n' "$rc" >&2
	fi
}
trap teardown EXIT
trap 'exit 130' INT TERM

# nsexec NS CMD...: run a command inside a namespace.
nsexec() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

# start NS NAME CMD...: start a helper in the background and wait until it listens.
start() {
	local ns=$1 name=$2; shift 2
	# Not through a function: $! must be the helper itself (ip netns exec execs it), so that
	# teardown's kill reaches it.
	ip netns exec "$ns" "$WORK/demo" "$@" -ready "$WORK/$name.ready" &
	PIDS+=($!)
	for _ in $(seq 50); do
		[[ -e $WORK/$name.ready ]] && return 0
		sleep 0.1
	done
	die "$name did not start"
}

# dial NS ADDR [setpriv args]: connect from a namespace and print the reply.
dial() {
	local ns=$1 addr=$2; shift 2
	nsexec "$ns" "$@" "$WORK/demo" dial "$addr" | sed 's/^/      -> /'
}

bold "proxy-init demo"
say "A meshed pod's TCP traffic must pass through its sidecar proxy without the app knowing."
say "proxy-init writes netfilter rules in the pod's network namespace that redirect inbound TCP to"
say "the proxy's port 4143 and outbound TCP to its port 4140. The proxy learns where each"
say "connection was really going from the kernel (SO_ORIGINAL_DST)."

bold "1. Build proxy-init and a small helper (fake proxy, servers, client)"
run "go build -o $WORK/ ./cmd/proxy-init ./test/demo"
go build -o "$WORK/" ./cmd/proxy-init ./test/demo
PI=$WORK/proxy-init

bold "2. Create a \"pod\" and a \"peer\" network namespace joined by a veth pair"
say "The peer stands for the rest of the cluster. Nothing is connected to this machine's network."
ip netns add "$POD"
ip netns add "$PEER"
for ns in "$POD" "$PEER"; do
	nsexec "$ns" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0
	ip -n "$ns" link set lo up
done
# Created inside the pod namespace with its other end born in the peer namespace. A distinct
# ifindex avoids the kernel delaying link-up (and IPv6) for veth ends with equal indexes.
ip -n "$POD" link add eth0 index 10 type veth peer name eth0 netns "$PEER"
ip -n "$POD" addr add "$POD4/24" dev eth0
ip -n "$POD" addr add "$POD6/64" dev eth0 nodad
ip -n "$PEER" addr add "$PEER4/24" dev eth0
ip -n "$PEER" addr add "$PEER6/64" dev eth0 nodad
ip -n "$POD" link set eth0 up
ip -n "$PEER" link set eth0 up
say "pod:  eth0 $POD4/24 $POD6/64"
say "peer: eth0 $PEER4/24 $PEER6/64"

bold "3. Start the programs"
start "$POD" proxy proxy -ports 4140,4143
say "pod:  fake proxy on 4140 (outbound) and 4143 (inbound), reporting original destinations"
start "$POD" app serve -port 8080 -name "pod app"
say "pod:  the application on 8080"
start "$POD" admin serve -port 4190 -name "proxy admin port"
say "pod:  the proxy's admin port 4190 (the kubelet probes it directly)"
start "$PEER" peer serve -port 80 -name "peer server"
say "peer: a server on 80"
say "Without rules, connections go straight to their destination:"
run "pod> dial $PEER4:80"
dial "$POD" "$PEER4:80"
run "peer> dial $POD4:8080"
dial "$PEER" "$POD4:8080"

bold "4. Run proxy-init in the pod with the Linkerd chart's arguments"
ARGS=(--incoming-proxy-port 4143 --outgoing-proxy-port 4140 --proxy-uid "$PROXY_UID"
	--inbound-ports-to-ignore 4190,4191,4567,4568 --outbound-ports-to-ignore 4567,4568)
run "proxy-init --netns /run/netns/$POD ${ARGS[*]}"
"$PI" --netns "/run/netns/$POD" "${ARGS[@]}" 2>&1 | sed 's/^/    /'
say "It entered the namespace in-process, picked a backend (logged with the reason: iptables-nft's"
say "rules over netlink where the kernel accepts them, else native nftables, else iptables-legacy) and"
say "wrote IPv4 and IPv6 in one transaction, running no program. Running it again changes nothing;"
say "--simulate prints the rules without writing."

bold "5. Traffic now goes through the proxy"
say "Outbound, IPv4 and IPv6: the app dials the peer; the proxy gets it on 4140 and knows the real target."
run "pod> dial $PEER4:80"
dial "$POD" "$PEER4:80"
run "pod> dial [$PEER6]:80"
dial "$POD" "[$PEER6]:80"
say "Inbound, IPv4 and IPv6: the peer dials the app; the proxy gets it on 4143."
run "peer> dial $POD4:8080"
dial "$PEER" "$POD4:8080"
run "peer> dial [$POD6]:8080"
dial "$PEER" "[$POD6]:8080"
say "The proxy's own traffic (UID $PROXY_UID) is exempt, or it would loop back into itself:"
run "pod> setpriv --reuid $PROXY_UID dial $PEER4:80"
dial "$POD" "$PEER4:80" setpriv --reuid "$PROXY_UID" --regid "$PROXY_UID" --clear-groups
say "Ignored inbound ports (here the admin port 4190) bypass the proxy:"
run "peer> dial $POD4:4190"
dial "$PEER" "$POD4:4190"

bold "6. The rules in place (proxy-init show, which needs no arguments)"
run "proxy-init show --netns /run/netns/$POD"
"$PI" show --netns "/run/netns/$POD" | sed 's/^/    /'
say "show reads the command line back from the rules and exits 1 unless they are whole (every rule"
say "and jump of that command line, both families agreeing, no other backend holding rules of ours):"
say "a health check for the pod's redirect."

bold "7. Clean up (proxy-init cleanup removes our chains and jumps, nothing else)"
run "proxy-init cleanup --netns /run/netns/$POD"
"$PI" cleanup --log-level warn --netns "/run/netns/$POD"
# nft lists native nftables and iptables-nft rules; iptables-legacy-save without -t lists only
# tables that exist, so it does not create one.
if { nsexec "$POD" nft list ruleset; nsexec "$POD" iptables-legacy-save; } | grep -qi proxy_init; then
	die "rules left after cleanup"
fi
say "Nothing of ours remains in any backend; connections go direct again:"
run "pod> dial $PEER4:80"
dial "$POD" "$PEER4:80"
