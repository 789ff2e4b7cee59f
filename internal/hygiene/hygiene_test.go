package hygiene

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
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
	{"a Mach-O binary", []byte("\xfe\xed\xfa\xce")},
	{"a Mach-O binary", []byte("\xfe\xed\xfa\xcf")},
	{"a Mach-O universal binary (or Java class)", []byte("\xca\xfe\xba\xbe")},
	{"a Windows PE executable", []byte("MZ")},
	{"a WebAssembly module", []byte("\x00asm")},
	{"an ar archive (a Go or C library)", []byte("!<arch>\n")},
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

// gitLsFiles lists the files git tracks in the checkout at root: committed or staged.
func gitLsFiles(root string) ([]string, error) {
	out, err := exec.Command("git", "-C", root, "ls-files", "-z").Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files in %s (the checks need the repository's git metadata): %w", root, err)
	}
	return strings.Split(strings.TrimRight(string(out), "\x00"), "\x00"), nil
}

// trackedFiles lists the files this repository tracks, failing t when that is not the repository.
func trackedFiles(t *testing.T, root string) []string {
	t.Helper()
	paths, err := gitLsFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) < 100 {
		t.Fatalf("git ls-files listed %d files; not the repository", len(paths))
	}
	return paths
}

// trackedProblems returns problem's message for each of the tracked paths under root that has one.
func trackedProblems(root string, paths []string) ([]string, error) {
	var problems []string
	for _, p := range paths {
		f, err := os.Open(filepath.Join(root, p))
		if os.IsNotExist(err) {
			continue // deleted in the work tree, not yet committed
		}
		if err != nil {
			return nil, err
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, err
		}
		head := make([]byte, 8)
		n, _ := f.Read(head)
		f.Close()
		if !fi.Mode().IsRegular() {
			continue // a symbolic link
		}
		if msg := problem(p, head[:n], fi.Size()); msg != "" {
			problems = append(problems, msg)
		}
	}
	return problems, nil
}

// TestTrackedProblemsInARepository shows the check failing: in a fresh repository, a staged ELF
// binary, ar archive and large file are each named; a script, a large file under testdata and an
// untracked binary are not.
func TestTrackedProblemsInARepository(t *testing.T) {
	root := t.TempDir()
	if out, err := exec.Command("git", "init", "-q", root).CombinedOutput(); err != nil {
		t.Fatalf("git init: %v\n%s", err, out)
	}
	elf := append([]byte("\x7fELF\x02\x01\x01"), make([]byte, 4096)...)
	files := map[string][]byte{
		"proxy-init":             elf,
		"internal/x/libx.a":      []byte("!<arch>\n__.PKGDEF"),
		"hack/run.sh":            []byte("#!/bin/sh\nexec go run ./hack/images\n"),
		"docs/big.md":            make([]byte, MaxFileSize+1),
		"x/testdata/big.golden":  make([]byte, MaxFileSize+1),
		"x/testdata/exact.bytes": make([]byte, MaxFileSize),
		"untracked-binary":       elf,
	}
	for name, data := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	add := exec.Command("git", "-C", root, "add", "--", "proxy-init", "internal", "hack", "docs", "x")
	if out, err := add.CombinedOutput(); err != nil {
		t.Fatalf("git add: %v\n%s", err, out)
	}
	paths, err := gitLsFiles(root)
	if err != nil {
		t.Fatal(err)
	}
	got, err := trackedProblems(root, paths)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		fmt.Sprintf("docs/big.md is %d bytes, over the %d a tracked file may have outside testdata", MaxFileSize+1, MaxFileSize),
		"internal/x/libx.a is an ar archive (a Go or C library): build outputs are not committed (add it to .gitignore)",
		"proxy-init is an ELF executable or object: build outputs are not committed (add it to .gitignore)",
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems in the fresh repository:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestTrackedFiles checks every file git tracks in this checkout.
func TestTrackedFiles(t *testing.T) {
	problems, err := trackedProblems("../..", trackedFiles(t, "../.."))
	if err != nil {
		t.Fatal(err)
	}
	for _, msg := range problems {
		t.Error(msg)
	}
}

// TestGitignoreCoversBuildOutputs: `go build ./path/to/cmd` at the repository's root writes a
// binary named after the command's directory there, so .gitignore lists each such name. The
// commands come from `go list`, so a new one fails here until .gitignore has it.
func TestGitignoreCoversBuildOutputs(t *testing.T) {
	list := exec.Command("go", "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "./...")
	list.Dir = "../.."
	out, err := list.Output()
	if err != nil {
		t.Fatalf("go list ./...: %v", err)
	}
	var names []string
	for _, p := range strings.Fields(string(out)) {
		name := path.Base(p)
		if regexp.MustCompile(`^v[0-9]+$`).MatchString(name) { // a major version's suffix
			name = path.Base(path.Dir(p))
		}
		names = append(names, name)
		err := exec.Command("git", "-C", "../..", "check-ignore", "-q", "--no-index", "--", name).Run()
		if exitErr := (*exec.ExitError)(nil); errors.As(err, &exitErr) && exitErr.ExitCode() == 1 {
			t.Errorf("go build ./%s at the root writes ./%s, which .gitignore does not ignore: add /%s to it",
				strings.TrimPrefix(p, "github.com/kubemesh/proxy-init/"), name, name)
		} else if err != nil {
			t.Fatalf("git check-ignore %s: %v", name, err)
		}
	}
	if !slices.Contains(names, "proxy-init") || !slices.Contains(names, "linkerd-cni") {
		t.Fatalf("go list found the commands %v; want proxy-init and linkerd-cni among them", names)
	}
}
