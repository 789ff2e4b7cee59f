package iptables

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
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
	for name, c := range GoldenConfigs() {
		t.Run(name, func(t *testing.T) {
			rs, err := Build(c)
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range []Family{IPv4, IPv6} {
				got := "# " + string(f) + ": not written\n"
				if rs.HasFamily(f) {
					got = rs.Payload(f, SavedState{})
					if viaSaved := TransitionPayload(SavedState{}, rs.Saved(f)); got != viaSaved {
						t.Errorf("%s: Payload differs from TransitionPayload of Saved:\n%s\nwant:\n%s", f, got, viaSaved)
					}
				}
				checkGolden(t, filepath.Join("iptables", name+"."+string(f)+".rules"), got)
			}
		})
	}
}
