package netnsutil

import (
	"os"
	"strings"
	"testing"
)

// The hook compares argv[0] with helperArg0, which must be HelperName and a NUL.
func TestHelperArg0(t *testing.T) {
	n := len(helperArg0) - 1
	if string(helperArg0[:n]) != HelperName || helperArg0[n] != 0 {
		t.Errorf("helperArg0 is %q, want %q and a NUL", helperArg0[:], HelperName)
	}
}

// make build links with the flag the tests' builds use.
func TestMakefileLinksTheHook(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if want := "ENTRY_HOOK := " + EntryHookFlag + "\n"; !strings.Contains(string(mk), want) {
		t.Errorf("the Makefile does not say %q", want)
	}
	if !strings.Contains(string(mk), "LDFLAGS := -s -w $(ENTRY_HOOK)") {
		t.Error("the Makefile's LDFLAGS do not pass $(ENTRY_HOOK)")
	}
}
