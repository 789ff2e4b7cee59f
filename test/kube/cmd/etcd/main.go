// Command etcd runs a single-member etcd server for the integration tests of
// the main module (see internal/kubetest). It wraps
// go.etcd.io/etcd/server/v3/embed so the etcd version is the one
// k8s.io/kubernetes itself is tested against.
//
// Limits: one member, plain HTTP, and only loopback URLs are accepted, so the
// test cluster can never listen on a routable address.
package main

import (
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "etcd: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	dataDir := flag.String("data-dir", "", "directory for the member's data (required)")
	clientURL := flag.String("listen-client-url", "http://127.0.0.1:2379", "client URL (loopback only)")
	peerURL := flag.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL (loopback only)")
	name := flag.String("name", "kubetest", "member name")
	flag.Parse()
	if *dataDir == "" {
		return fmt.Errorf("--data-dir is required")
	}
	cu, err := loopbackURL("--listen-client-url", *clientURL)
	if err != nil {
		return err
	}
	pu, err := loopbackURL("--listen-peer-url", *peerURL)
	if err != nil {
		return err
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", *name, pu.String())
	cfg.LogLevel = "warn"
	// Tests create and throw away many small clusters; fsync costs dominate
	// start-up and nothing here needs durability across a crash.
	cfg.UnsafeNoFsync = true

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	defer e.Close()

	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready, serving clients on %s\n", cu)
	case <-time.After(60 * time.Second):
		e.Server.Stop()
		return fmt.Errorf("etcd did not become ready within 60s")
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case s := <-sig:
		fmt.Fprintf(os.Stderr, "etcd: %v received, stopping\n", s)
		return nil
	case err := <-e.Err():
		return fmt.Errorf("etcd server: %w", err)
	}
}

// loopbackURL parses raw and refuses any host that is not a loopback IP
// literal: the harness must never expose etcd beyond the machine.
func loopbackURL(flagName, raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", flagName, raw, err)
	}
	if u.Scheme != "http" {
		return nil, fmt.Errorf("%s %q: scheme must be http", flagName, raw)
	}
	ip := net.ParseIP(u.Hostname())
	if ip == nil || !ip.IsLoopback() {
		return nil, fmt.Errorf("%s %q: host must be a loopback IP", flagName, raw)
	}
	if u.Port() == "" {
		return nil, fmt.Errorf("%s %q: port is required", flagName, raw)
	}
	return u, nil
}
