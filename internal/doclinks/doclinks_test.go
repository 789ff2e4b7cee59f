package doclinks

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestRepositoryDocs checks the real documentation.
func TestRepositoryDocs(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found at %s: %v", root, err)
	}
	files := []string{"README.md", "CONTRIBUTING.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md found")
	}
	for _, d := range docs {
		files = append(files, filepath.Join("docs", filepath.Base(d)))
	}
	problems, err := Check(root, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
}

func TestCheckFindsBrokenLinks(t *testing.T) {
	root := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("main.go", "package main\n")
	write("docs/b.md", "# Page B\n\n## Exit codes\n\n## Exit codes\n")
	write("README.md", strings.Join([]string{
		"# Title",
		"[ok](docs/b.md) [ok](docs/b.md#exit-codes) [ok](docs/b.md#exit-codes-1) [ok](main.go)",
		"[ok](docs/) [ok](#title) [ok](https://example.com/x.md) ![ok](docs/b.md \"title\")",
		"[missing](docs/c.md)",
		"[bad anchor](docs/b.md#exit-code)",
		"[bad self anchor](#no-such)",
		"[outside](../x.md)",
		"[anchor into code](main.go#L1)",
		"`[in code](nowhere.md)`",
		"```",
		"[in a fence](nowhere.md)",
		"```",
	}, "\n"))
	got, err := Check(root, []string{"README.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		`README.md:4: link "docs/c.md": no such file or directory`,
		`README.md:5: link "docs/b.md#exit-code": docs/b.md has no heading with the anchor #exit-code`,
		`README.md:6: link "#no-such": README.md has no heading with the anchor #no-such`,
		`README.md:7: link "../x.md": points outside the repository`,
		`README.md:8: link "main.go#L1": an anchor into a file that is not Markdown`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestSlug(t *testing.T) {
	tests := []struct{ heading, want string }{
		{"Exit codes", "exit-codes"},
		{"Prevention: a startup taint", "prevention-a-startup-taint"},
		{"`make stress`", "make-stress"},
		{"Repair controller: `linkerd-cni repair`", "repair-controller-linkerd-cni-repair"},
		{"The rules (iptables modes)", "the-rules-iptables-modes"},
		{`"half-applied" in show or CHECK`, "half-applied-in-show-or-check"},
		{"My app's init container", "my-apps-init-container"},
		{"Plugin logs in `kubectl logs`", "plugin-logs-in-kubectl-logs"},
		{"See [the docs](docs/x.md) now", "see-the-docs-now"},
		{"snake_case and CAPS", "snake_case-and-caps"},
	}
	for _, tt := range tests {
		if got := Slug(tt.heading); got != tt.want {
			t.Errorf("Slug(%q) = %q, want %q", tt.heading, got, tt.want)
		}
	}
}
