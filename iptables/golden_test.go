package iptables_test

import (
	"flag"
	"path/filepath"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current output")

// checkGolden compares got with testdata/<name>, or rewrites it under -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	iptablestest.CheckGolden(t, filepath.Join("testdata", name), got, *update, "iptables")
}

func TestGoldenRestorePayloads(t *testing.T) {
	for name, c := range iptablestest.GoldenConfigs() {
		t.Run(name, func(t *testing.T) {
			rs := iptablestest.Build(t, c)
			for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
				got := "# " + string(f) + ": not written\n"
				if rs.HasFamily(f) {
					got = iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f))
				}
				checkGolden(t, filepath.Join("iptables", name+"."+string(f)+".rules"), got)
			}
		})
	}
}

func TestGoldenNFTScripts(t *testing.T) {
	for name, c := range iptablestest.GoldenConfigs() {
		t.Run(name, func(t *testing.T) {
			checkGolden(t, filepath.Join("nft", name+".nft"), iptablestest.NFTScript(iptablestest.Build(t, c).NFT()))
		})
	}
}
