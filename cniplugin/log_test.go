package cniplugin

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/test/netnstest"
)

// TestOpenLogFile: log_file is appended to as root, so every way for someone else to redirect
// that write elsewhere is refused with the reason, and the file it would have reached is unchanged.
func TestOpenLogFile(t *testing.T) {
	netnstest.RequireRoot(t) // chown
	mk := func(t *testing.T, mode os.FileMode) string {
		d := filepath.Join(t.TempDir(), "log")
		if err := os.Mkdir(d, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, mode); err != nil {
			t.Fatal(err)
		}
		return d
	}
	tests := []struct {
		name string
		// setup returns the log_file path and a file whose content must not change ("" for none).
		setup func(t *testing.T) (path, victim string)
		want  string // "" for success; else the error, with the path as %s
	}{
		{"new file in root's directory", func(t *testing.T) (string, string) {
			return filepath.Join(mk(t, 0o755), "linkerd-cni.log"), ""
		}, ""},
		{"relative", func(t *testing.T) (string, string) { return "linkerd-cni.log", "" },
			"log_file linkerd-cni.log: not an absolute path"},
		{"symbolic link", func(t *testing.T) (string, string) {
			d := mk(t, 0o755)
			victim := filepath.Join(d, "shadow")
			writeTestFile(t, victim, "secret\n")
			p := filepath.Join(d, "linkerd-cni.log")
			if err := os.Symlink(victim, p); err != nil {
				t.Fatal(err)
			}
			return p, victim
		}, "log_file %s: refusing a path through a symbolic link"},
		{"directory through a symbolic link", func(t *testing.T) (string, string) {
			d := mk(t, 0o755)
			link := filepath.Join(filepath.Dir(d), "via")
			if err := os.Symlink(d, link); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(link, "linkerd-cni.log"), ""
		}, "log_file %s: its directory DIR is a symbolic link"},
		{"directory others may write", func(t *testing.T) (string, string) {
			return filepath.Join(mk(t, 0o777), "linkerd-cni.log"), ""
		}, "log_file %s: its directory DIR is writable by others than root (mode 777)"},
		{"directory owned by another user", func(t *testing.T) (string, string) {
			d := mk(t, 0o755)
			if err := os.Chown(d, 1000, 1000); err != nil {
				t.Fatal(err)
			}
			return filepath.Join(d, "linkerd-cni.log"), ""
		}, "log_file %s: its directory DIR is not owned by root"},
		{"file owned by another user", func(t *testing.T) (string, string) {
			p := filepath.Join(mk(t, 0o755), "linkerd-cni.log")
			writeTestFile(t, p, "")
			if err := os.Chown(p, 1000, 1000); err != nil {
				t.Fatal(err)
			}
			return p, ""
		}, "log_file %s: owned by uid 1000, not root"},
		{"hard link to another file", func(t *testing.T) (string, string) {
			d := mk(t, 0o755)
			victim := filepath.Join(d, "shadow")
			writeTestFile(t, victim, "secret\n")
			p := filepath.Join(d, "linkerd-cni.log")
			if err := os.Link(victim, p); err != nil {
				t.Fatal(err)
			}
			return p, victim
		}, "log_file %s: has 2 hard links; a log file has one"},
		{"not a regular file", func(t *testing.T) (string, string) {
			p := filepath.Join(mk(t, 0o755), "linkerd-cni.log")
			if err := os.Mkdir(p, 0o755); err != nil {
				t.Fatal(err)
			}
			return p, ""
		}, "open %s: is a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path, victim := tt.setup(t)
			var before []byte
			if victim != "" {
				before, _ = os.ReadFile(victim)
			}
			var stderr bytes.Buffer
			log, _, done := newLogger(&stderr, slog.LevelInfo, path)
			log.Info("a line")
			done()
			if victim != "" {
				if after, _ := os.ReadFile(victim); !bytes.Equal(after, before) {
					t.Errorf("%s was written through log_file: %q", victim, after)
				}
			}
			f, err := OpenLogFile(path)
			if tt.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				f.Close()
				fi, err := os.Stat(path)
				if err != nil || fi.Mode().Perm() != 0o600 {
					t.Errorf("log_file mode %v (%v), want 0600", fi.Mode(), err)
				}
				if b, _ := os.ReadFile(path); !strings.Contains(string(b), "msg=\"a line\"") {
					t.Errorf("log_file holds %q, want the line", b)
				}
				return
			}
			want := strings.ReplaceAll(strings.ReplaceAll(tt.want, "%s", path), "DIR", filepath.Dir(path))
			if err == nil || err.Error() != want {
				t.Fatalf("OpenLogFile = %v\nwant %s", err, want)
			}
			if !strings.Contains(stderr.String(), "cannot use log_file; logging to stderr only") || !strings.Contains(stderr.String(), "a line") {
				t.Errorf("stderr lacks the warning or the line:\n%s", stderr.String())
			}
		})
	}
}

func writeTestFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
