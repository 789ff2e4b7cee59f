package hygiene

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// binaryMagic are the first bytes of the compiled formats a Go toolchain (or any other) writes.
var binaryMagic = []struct {
	name  string
	magic []byte
}{
	{"an ELF executable or object", []byte("\x7fELF")},
	{"a Mach-O binary", []byte("\xcf\xfa\xed\xfe")},
	{"a Mach-O binary", []byte("\xce\xfa\xed\xfe")},
	{"a Mach-O universal binary", []byte("\xca\xfe\xba\xbe")},
	{"a Windows PE executable", []byte("MZ")},
	{"a WebAssembly module", []byte("\x00asm")},
	{"a Go archive", []byte("!<arch>\n")},
}

// problem says what is wrong with a tracked file, or "" when nothing is.
func problem(path string, head []byte, size int64) string {
	for _, m := range binaryMagic {
		if bytes.HasPrefix(head, m.magic) {
			return fmt.Sprintf("%s is %s: build outputs are not committed (add it to .gitignore)", path, m.name)
		}
	}
	inTestdata := slices.Contains(strings.Split(filepath.ToSlash(path), "/"), "testdata")
	if size > MaxFileSize && !inTestdata {
		return fmt.Sprintf("%s is %d bytes, over the %d a tracked file may have outside testdata", path, size, MaxFileSize)
	}
	return ""
}

func TestProblem(t *testing.T) {
	big := int64(MaxFileSize + 1)
	tests := []struct {
		path string
		head string
		size int64
		want string
	}{
		{"proxy-init", "\x7fELF\x02\x01", 6 << 20, "proxy-init is an ELF executable or object: build outputs are not committed (add it to .gitignore)"},
		{"tool.exe", "MZ\x90\x00", 10, "tool.exe is a Windows PE executable: build outputs are not committed (add it to .gitignore)"},
		{"hack/demo.sh", "#!/usr/bin/env bash\n", 4000, ""},
		{"docs/big.md", "# a page", big, fmt.Sprintf("docs/big.md is %d bytes, over the %d a tracked file may have outside testdata", big, MaxFileSize)},
		{"iptables/testdata/big.golden", "*nat\n", big, ""},
		{"iptables/testdata/bin", "\x7fELF", 100, "iptables/testdata/bin is an ELF executable or object: build outputs are not committed (add it to .gitignore)"},
	}
	for _, tt := range tests {
		if got := problem(tt.path, []byte(tt.head), tt.size); got != tt.want {
			t.Errorf("problem(%q) = %q, want %q", tt.path, got, tt.want)
		}
	}
}

// TestTrackedFiles checks every file git tracks in this checkout.
func TestTrackedFiles(t *testing.T) {
	out, err := exec.Command("git", "-C", "../..", "ls-files", "-z").Output()
	if err != nil {
		t.Fatalf("git ls-files (the check needs the repository's git metadata): %v", err)
	}
	paths := strings.Split(strings.TrimRight(string(out), "\x00"), "\x00")
	if len(paths) < 100 {
		t.Fatalf("git ls-files listed %d files; not the repository", len(paths))
	}
	for _, p := range paths {
		f, err := os.Open(filepath.Join("../..", p))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			t.Fatal(err)
		}
		head := make([]byte, 8)
		n, _ := f.Read(head)
		f.Close()
		if !fi.Mode().IsRegular() {
			continue // a symbolic link
		}
		if msg := problem(p, head[:n], fi.Size()); msg != "" {
			t.Error(msg)
		}
	}
}
