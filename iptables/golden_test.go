package iptables_test

import (
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/iptablestest"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current output")

// checkGolden compares got with testdata/<name>, or rewrites it under -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./iptables -update to create it)", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from the golden file (run go test ./iptables -update if intended):\ngot:\n%s\nwant:\n%s", path, got, want)
	}
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
