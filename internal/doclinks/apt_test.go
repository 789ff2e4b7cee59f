package doclinks

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// englishList spells items as the pages do: "a, b and c".
func englishList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}

// TestAptPackagesNamed: the pages that say what `make deps` and `make e2e-deps` install name
// exactly the Makefile's lists, in its order, so a package added there must be added here.
func TestAptPackagesNamed(t *testing.T) {
	read := func(path string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", path))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Join(strings.Fields(string(b)), " ") // line breaks as spaces
	}
	makefile := read("Makefile")
	for _, c := range []struct{ variable, page string }{
		{"APT_PACKAGES", "README.md"},
		{"APT_PACKAGES", "CONTRIBUTING.md"},
		{"E2E_APT_PACKAGES", "docs/e2e.md"},
	} {
		m := regexp.MustCompile(`\b` + c.variable + ` := ([a-z0-9 .+-]+?) (?:#|[A-Z_]+ :=|\.PHONY)`).FindStringSubmatch(makefile)
		if m == nil {
			t.Fatalf("the Makefile sets no %s", c.variable)
		}
		want := "installs " + englishList(strings.Fields(m[1]))
		if !strings.Contains(read(c.page), want) {
			t.Errorf("%s does not say %q (the Makefile's %s)", c.page, want, c.variable)
		}
	}
}
