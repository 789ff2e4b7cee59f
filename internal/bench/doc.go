// Package bench holds `make bench`: apply latency of proxy-init's backends against the raw tools
// they replace (iptables-restore, nft -f), and the per-connection cost of the rules. It measures
// and prints; it asserts nothing about speed, so a slow machine never fails a build.
package bench
