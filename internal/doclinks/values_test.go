package doclinks

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// valueKeys lists every key of a values file, nested ones as dotted paths.
func valueKeys(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	var out []string
	var walk func(prefix string, m map[string]any)
	walk = func(prefix string, m map[string]any) {
		for k, v := range m {
			out = append(out, prefix+k)
			if sub, ok := v.(map[string]any); ok {
				walk(prefix+k+".", sub)
			}
		}
	}
	walk("", v)
	slices.Sort(out)
	return out
}

// TestOwnValuesListed: migration.md's "Our own values" names every key of our chart's values
// that Linkerd 2.20's chart lacks (a key, or one of its parents), and only keys our chart has.
func TestOwnValuesListed(t *testing.T) {
	ours := valueKeys(t, "deploy/charts/linkerd2-cni/values.yaml")
	linkerd := valueKeys(t, "cniplugin/install/testdata/linkerd-2.20-defaults.yaml")
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "migration.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, para, ok := strings.Cut(string(b), "- Our own values:")
	if !ok {
		t.Fatal(`docs/migration.md has no "- Our own values:" item`)
	}
	para, _, _ = strings.Cut(para, "\n- ")
	var named []string
	for _, m := range regexp.MustCompile("`([^`]+)`").FindAllStringSubmatch(para, -1) {
		if slices.Contains(ours, m[1]) {
			named = append(named, m[1])
		}
	}
	covered := func(k string) bool {
		for p := k; ; {
			if slices.Contains(named, p) {
				return true
			}
			i := strings.LastIndex(p, ".")
			if i < 0 {
				return false
			}
			p = p[:i]
		}
	}
	for _, k := range ours {
		if !slices.Contains(linkerd, k) && !covered(k) {
			t.Errorf("docs/migration.md's own values do not name %s, which Linkerd's chart lacks", k)
		}
	}
	for _, k := range named {
		// iptablesMode is Linkerd's key, named for the values ours adds to it.
		if slices.Contains(linkerd, k) && k != "iptablesMode" {
			t.Errorf("docs/migration.md's own values name %s, which Linkerd's chart has too", k)
		}
	}
}
