package rootonly

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

func TestMakeAndCheck(t *testing.T) {
	tests := []struct {
		name    string
		prepare func(t *testing.T, parent, dir string)
		want    string // "" when accepted; %[1]s is dir, %[2]s its parent
	}{
		{"made", func(*testing.T, string, string) {}, ""},
		{"existing, root-only", func(t *testing.T, _, dir string) { mkdir(t, dir, 0o700) }, ""},
		{"open to others", func(t *testing.T, _, dir string) { mkdir(t, dir, 0o750) },
			"refusing %[1]s: mode 0750 gives others access (want at most 0700)"},
		{"a file", func(t *testing.T, _, dir string) {
			if err := os.WriteFile(dir, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}, "make the directory %[1]s: mkdir %[1]s: not a directory"},
		{"a symbolic link to a root-only directory", func(t *testing.T, _, dir string) {
			if err := os.Symlink(t.TempDir(), dir); err != nil {
				t.Fatal(err)
			}
		}, "refusing %[1]s: not a directory (mode Lrwxrwxrwx)"},
		{"in a parent others may write", func(t *testing.T, parent, _ string) {
			if err := os.Chmod(parent, 0o777); err != nil {
				t.Fatal(err)
			}
		}, "refusing %[2]s: mode 0777 gives others access (want at most 0755)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			parent := t.TempDir()
			dir := filepath.Join(parent, "locks")
			tt.prepare(t, parent, dir)
			err := Make(dir)
			want := ""
			if tt.want != "" {
				want = fmt.Sprintf(tt.want, dir, parent)
			}
			if got := fmt.Sprint(err); (err == nil) != (want == "") || err != nil && got != want {
				t.Errorf("Make: %v, want %q", err, want)
			}
			if fi, err := os.Lstat(dir); want == "" && (err != nil || fi.Mode().Perm() != 0o700) {
				t.Errorf("made %v, %v; want a directory of mode 0700", fi, err)
			}
		})
	}
	if err := Check(filepath.Join(t.TempDir(), "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Check of a missing directory: %v, want fs.ErrNotExist", err)
	}
}

func mkdir(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
}
