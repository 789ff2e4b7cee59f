package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestString(t *testing.T) {
	plat := runtime.GOOS + "/" + runtime.GOARCH
	tests := []struct {
		name string
		info Info
		want string
	}{
		{"unstamped", Info{Version: "dev", GoVersion: "go1.26.8", Platform: plat}, "dev (go1.26.8 " + plat + ")"},
		{"vcs", Info{Version: "v1.2.3", GoVersion: "go1.26.8", Platform: plat, Revision: "4fa3da8a0b1c2d3e4f", Time: "2026-11-29T10:00:00Z", Modified: true},
			"v1.2.3 (revision 4fa3da8a0b1c-dirty, 2026-11-29T10:00:00Z; go1.26.8 " + plat + ")"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.info.String(); got != tt.want {
				t.Errorf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestGetReportsVersionAndToolchain(t *testing.T) {
	old := Version
	t.Cleanup(func() { Version = old })
	Version = "v9.9.9"
	got := Get()
	if got.Version != "v9.9.9" || got.GoVersion != runtime.Version() {
		t.Fatalf("Get() = %+v, want version v9.9.9 and %s", got, runtime.Version())
	}
	if !strings.Contains(got.String(), "v9.9.9") {
		t.Errorf("String() %q lacks the version", got.String())
	}
}
