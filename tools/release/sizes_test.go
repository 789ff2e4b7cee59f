package release

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/tools/images"
)

// sizeTolerance is how far a size the docs give may be from the one measured: builds move with
// Go, the dependencies and Debian's packages, and the docs round.
const sizeTolerance = 0.10

// docSize finds re's first match in a page of docs/ and returns its size in bytes: re's first
// group is the number, its second the unit (MB: 10^6 bytes, MiB: 2^20).
func docSize(t *testing.T, page string, re *regexp.Regexp) (float64, string) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", page))
	if err != nil {
		t.Fatal(err)
	}
	m := re.FindStringSubmatch(string(b))
	if m == nil {
		t.Fatalf("docs/%s: nothing matches %s", page, re)
	}
	n, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	unit := map[string]float64{"MB": 1e6, "MiB": 1 << 20}[m[2]]
	if unit == 0 {
		t.Fatalf("docs/%s: unit %q in %q", page, m[2], m[0])
	}
	return n * unit, m[0]
}

// checkSize fails when measured is more than sizeTolerance away from what the docs say.
func checkSize(t *testing.T, what string, doc float64, quote string, measured int64) {
	t.Helper()
	t.Logf("%s: %.2f MB, %.2f MiB (the docs: %q)", what, float64(measured)/1e6, float64(measured)/(1<<20), quote)
	if d := float64(measured)/doc - 1; d > sizeTolerance || d < -sizeTolerance {
		t.Errorf("%s is %.1f MB (%.1f MiB), %+.0f%% off the docs' %q: update them", what, float64(measured)/1e6, float64(measured)/(1<<20), d*100, quote)
	}
}

// checkBinarySizes holds performance.md's sizes of the linux/amd64 binaries (built as make build
// builds them) to those in bin.
func checkBinarySizes(t *testing.T, bin string) {
	t.Helper()
	for _, c := range []struct {
		path string
		re   string
	}{
		{"plugin/linkerd-cni", `The plugin-only linkerd-cni is ([0-9.]+) (MB|MiB)`},
		{"plugin/linkerd-cni", "\\| `bin/plugin/linkerd-cni`, the plugin-only build \\| \\*\\*([0-9.]+) (MB|MiB)\\*\\*"},
		{"linkerd-cni", "\\| `bin/linkerd-cni`, linux/amd64, static and stripped \\| \\*\\*([0-9.]+) (MB|MiB)\\*\\*"},
	} {
		fi, err := os.Stat(filepath.Join(images.PlatformBinDir(bin, "linux/amd64"), c.path))
		if err != nil {
			t.Fatal(err)
		}
		doc, quote := docSize(t, "performance.md", regexp.MustCompile(c.re))
		checkSize(t, "linux/amd64 "+c.path, doc, quote, fi.Size())
	}
}

// checkImageSizes holds images.md's table of compressed image sizes, and performance.md's
// linkerd-cni image, to those of the release res.
func checkImageSizes(t *testing.T, res *Result) {
	t.Helper()
	for _, r := range res.Images {
		row := "`" + r.Name + "`"
		if strings.HasSuffix(r.Name, "-nftables") {
			row = "`proxy-init:…-nftables`"
		}
		re := regexp.MustCompile(`(?m)^\| ` + regexp.QuoteMeta(row) + ` \| ([0-9.]+) (MiB|MB) \| ([0-9.]+) (MiB|MB) \|$`)
		b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "images.md"))
		if err != nil {
			t.Fatal(err)
		}
		m := re.FindStringSubmatch(string(b))
		if m == nil {
			t.Errorf("docs/images.md has no sizes row %s", row)
			continue
		}
		for _, p := range r.Platforms {
			col := map[string]int{"linux/amd64": 1, "linux/arm64": 3}[p.Platform]
			if col == 0 {
				t.Errorf("%s: platform %s has no column in docs/images.md's sizes", r.Name, p.Platform)
				continue
			}
			n, _ := strconv.ParseFloat(m[col], 64)
			unit := map[string]float64{"MB": 1e6, "MiB": 1 << 20}[m[col+1]]
			checkSize(t, fmt.Sprintf("the %s image for %s, compressed", r.Name, p.Platform), n*unit, m[0], p.Size)
			if r.Name == "linkerd-cni" && p.Platform == "linux/amd64" {
				doc, quote := docSize(t, "performance.md", regexp.MustCompile("\\| the `linkerd-cni` image, linux/amd64, compressed \\| \\*\\*([0-9.]+) (MiB|MB)\\*\\* \\|"))
				checkSize(t, "the linkerd-cni image for linux/amd64 (performance.md)", doc, quote, p.Size)
			}
		}
	}
}
