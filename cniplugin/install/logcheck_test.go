package install

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCheckLogFile: log_file passes as the plugin would open it (a root-only directory, a
// regular root file with one link, or none yet) and is refused, naming the path and the reason,
// otherwise.
func TestCheckLogFile(t *testing.T) {
	const lf = "/var/log/linkerd-cni/plugin.log"
	tests := []struct {
		name    string
		prepare func(t *testing.T, dir, file string) // dir and file as this process sees them
		want    string                               // "" when accepted
	}{
		{"absent, creatable", func(*testing.T, string, string) {}, ""},
		{"a root file", func(t *testing.T, _, f string) { writeEmpty(t, f) }, ""},
		{"directory writable by others", func(t *testing.T, d, _ string) { chmod(t, d, 0o777) },
			"its directory /var/log/linkerd-cni is writable by others than root (mode 777)"},
		{"directory writable by its group", func(t *testing.T, d, _ string) { chmod(t, d, 0o775) },
			"its directory /var/log/linkerd-cni is writable by others than root (mode 775)"},
		{"directory of another user", func(t *testing.T, d, _ string) { chown(t, d, 1000) },
			"its directory /var/log/linkerd-cni is owned by uid 1000, not root"},
		{"file of another user", func(t *testing.T, _, f string) { writeEmpty(t, f); chown(t, f, 1000) }, "owned by uid 1000, not root"},
		{"file is a symbolic link", func(t *testing.T, d, f string) { symlink(t, "/etc/shadow", f) },
			"/var/log/linkerd-cni/plugin.log is a symbolic link: the plugin opens no path through one"},
		{"directory is a symbolic link", func(t *testing.T, d, _ string) {
			if err := os.Remove(d); err != nil {
				t.Fatal(err)
			}
			symlink(t, "/etc", d)
		}, "/var/log/linkerd-cni is a symbolic link"},
		{"hard link", func(t *testing.T, d, f string) {
			writeEmpty(t, f)
			if err := os.Link(f, filepath.Join(d, "other")); err != nil {
				t.Fatal(err)
			}
		}, "has 2 hard links; a log file has one"},
		{"a directory", func(t *testing.T, _, f string) { mkdirMode(t, f, 0o755) }, "not a regular file"},
		{"directory missing", func(t *testing.T, d, _ string) {
			if err := os.Remove(d); err != nil {
				t.Fatal(err)
			}
		}, "its directory /var/log/linkerd-cni does not exist on the node (or is not mounted into install-cni at "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if strings.Contains(tt.name, "another user") && os.Geteuid() != 0 {
				t.Skip("chown needs root")
			}
			prefix := t.TempDir()
			dir := filepath.Join(prefix, "var/log/linkerd-cni")
			mkdirMode(t, dir, 0o755)
			tt.prepare(t, dir, filepath.Join(dir, "plugin.log"))
			err := checkLogFile(prefix, lf)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tt.want != "" && (err == nil || !strings.HasPrefix(err.Error(), "log_file "+lf+": ") || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("got %v, want log_file %s: …%s…", err, lf, tt.want)
			}
		})
	}
	if err := checkLogFile(t.TempDir(), "plugin.log"); err == nil || err.Error() != "log_file plugin.log: not an absolute path" {
		t.Errorf("relative path: %v", err)
	}
}

// TestBadLogFileOnReady: the installer adds its entry, but /ready reports a log_file the plugin
// would refuse, naming it and why, until it is fixed.
func TestBadLogFileOnReady(t *testing.T) {
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	logDir := filepath.Join(h.root, "host/var/log/linkerd-cni")
	mkdirMode(t, logDir, 0o755)
	chmod(t, logDir, 0o777) // a log shipper's mount, writable by anyone
	h.cfg.NetworkConfig = strings.Replace(DefaultNetworkConfig, `"log_level":"info",`,
		`"log_level":"info","log_file":"/var/log/linkerd-cni/plugin.log",`, 1)
	r := h.start(t)
	waitFor(t, 5*time.Second, "the entry", func() (bool, string) {
		d := h.read(t, "10-calico.conflist")
		return hasLinkerdLast(d), d
	})
	want := "log_file /var/log/linkerd-cni/plugin.log: its directory /var/log/linkerd-cni is writable by others than root (mode 777)"
	waitFor(t, 5*time.Second, "/ready to name log_file", func() (bool, string) {
		code, body := r.ready(t)
		return code == http.StatusServiceUnavailable && strings.Contains(body, want), fmt.Sprintf("%d %s", code, body)
	})
	if n := strings.Count(r.logs.String(), "is writable by others than root"); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
	chmod(t, logDir, 0o755)
	h.replace(t, "10-calico.conflist", calicoConflist) // any event: the next sync checks again
	r.waitReady(t)
}

func writeEmpty(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, path string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func chown(t *testing.T, path string, uid int) {
	t.Helper()
	if err := os.Lchown(path, uid, uid); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

func mkdirMode(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(dir, mode); err != nil {
		t.Fatal(err)
	}
	chmod(t, dir, mode)
}
