package release

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"helm.sh/helm/v3/pkg/strvals"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	"github.com/kubemesh/proxy-init/test/helmchart"
	"github.com/kubemesh/proxy-init/tools/chart"
	"github.com/kubemesh/proxy-init/tools/images"
)

// The placeholders of docs/install.md's "Install from a checkout" that a test replaces.
const (
	docRegistry   = "registry.example/kubemesh"
	docReleaseDir = "bin/release/"
)

// checkoutBlock returns the command block of docs/install.md's "Install from a checkout" that
// has a line starting with first.
func checkoutBlock(t *testing.T, first string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Install from a checkout\n")
	if !ok {
		t.Fatal(`docs/install.md has no "## Install from a checkout"`)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1) {
		lines := strings.Split(strings.TrimSpace(strings.ReplaceAll(m[1], "\\\n", "")), "\n")
		if slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, first) }) {
			return lines
		}
	}
	t.Fatalf("docs/install.md's \"Install from a checkout\" has no sh block with a line starting %q", first)
	return nil
}

// helmArgs runs a doc block's lines in bash, in the repository, with make, kubectl and ctr doing
// nothing and helm printing its arguments, and returns the arguments of its one helm call.
// replace is applied to the lines first (the doc's placeholders for the test's paths).
func helmArgs(t *testing.T, lines []string, replace *strings.Replacer) []string {
	t.Helper()
	script := "set -euo pipefail\nmake() { :; }\nkubectl() { :; }\nctr() { :; }\nhelm() { printf '%s\\0' \"$@\"; }\n" +
		replace.Replace(strings.Join(lines, "\n")) + "\n"
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = repoRoot
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("the doc's block in bash: %v\n%s\n%s", err, script, stderr.String())
	}
	args := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
	if len(args) < 5 || !slices.Equal(args[:5], []string{"install", "linkerd2-cni", helmchart.ChartDir, "-n", helmchart.Namespace}) {
		t.Fatalf("helm %q: want helm install linkerd2-cni %s -n %s ...", args, helmchart.ChartDir, helmchart.Namespace)
	}
	return args[5:]
}

// renderWithSets renders the checkout's chart with helm's --set arguments, parsed by Helm's own
// parser, and returns every image the DaemonSet's containers run.
func renderWithSets(t *testing.T, args []string) []string {
	t.Helper()
	values := map[string]any{}
	for i := 0; i < len(args); i++ {
		if args[i] != "--set" || i+1 == len(args) {
			t.Fatalf("helm argument %q: the test knows only --set key=value", args[i])
		}
		i++
		if err := strvals.ParseInto(args[i], values); err != nil {
			t.Fatalf("--set %s: %v", args[i], err)
		}
	}
	ch, err := helmchart.Load(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	files, err := helmchart.Render(ch, values)
	if err != nil {
		t.Fatalf("render with %v: %v", values, err)
	}
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal([]byte(files["30-daemonset.yaml"]), &ds); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, c := range append(ds.Spec.Template.Spec.InitContainers, ds.Spec.Template.Spec.Containers...) {
		out = append(out, c.Image)
	}
	if len(out) == 0 {
		t.Fatal("the DaemonSet has no containers")
	}
	return out
}

// checkInstallThroughRegistry runs docs/install.md's registry block after a release like its
// `make release` (res, pushed to host): the VERSION it gives is one `make release` takes, and the
// chart rendered with its --set values runs the pushed linkerd-cni image by its digest, which the
// registry serves.
func checkInstallThroughRegistry(t *testing.T, res *Result, out, host string) {
	t.Helper()
	lines := checkoutBlock(t, "make release ")
	makeLine := lines[slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "make release ") })]
	// The make line as bash expands it, in the checkout: the variables it gives make.
	cmd := exec.Command("bash", "-c", "set -euo pipefail\nmake() { printf '%s\\0' \"$@\"; }\n"+makeLine)
	cmd.Dir = repoRoot
	raw, err := cmd.Output()
	if err != nil {
		t.Fatalf("%q in bash: %v", makeLine, err)
	}
	var version, registry string
	for _, f := range strings.Split(strings.TrimSuffix(string(raw), "\x00"), "\x00")[1:] {
		switch k, v, _ := strings.Cut(f, "="); k {
		case "VERSION":
			version = v
		case "REGISTRY":
			registry = v
		default:
			t.Errorf("%q: the test knows no %s", makeLine, f)
		}
	}
	if registry != docRegistry {
		t.Errorf("%q: REGISTRY=%s, the test replaces %s", makeLine, registry, docRegistry)
	}
	// The doc's VERSION is one make release accepts.
	if _, err := chart.Version(version); err != nil {
		t.Errorf("%q gives %v", makeLine, err)
	}

	r := res.Images[slices.IndexFunc(res.Images, func(r Released) bool { return r.Name == "linkerd-cni" })]
	args := helmArgs(t, lines, strings.NewReplacer(docReleaseDir, out+"/", docRegistry, host+"/kubemesh"))
	want := host + "/kubemesh/linkerd-cni@" + r.Digest.String()
	for _, img := range renderWithSets(t, args) {
		if img != want {
			t.Errorf("the DaemonSet runs %s, want %s (what make release pushed)", img, want)
		}
	}
	d, err := name.NewDigest(want)
	if err != nil {
		t.Fatal(err)
	}
	if desc, err := remote.Head(d, loopbackOnly...); err != nil || desc.Digest != r.Digest {
		t.Errorf("%s in the registry: %v, %v", want, desc, err)
	}
}

// archiveName is the name `ctr images import` gives the image of an archive make images wrote:
// its index entry's io.containerd.image.name.
func archiveName(t *testing.T, archive string) string {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("%s: no index.json (%v)", archive, err)
		}
		if h.Name != "index.json" {
			continue
		}
		b, _ := io.ReadAll(tr)
		var idx struct {
			Manifests []struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"manifests"`
		}
		if err := json.Unmarshal(b, &idx); err != nil || len(idx.Manifests) != 1 {
			t.Fatalf("%s: index.json %s: %v", archive, b, err)
		}
		return idx.Manifests[0].Annotations[images.AnnotationImageName]
	}
}

// checkInstallByImport runs docs/install.md's per-node block: the chart rendered with its --set
// values runs, for the doc's tag, the name the archive gives the image on import (checked on an
// archive of the release without a registry, whose images are built as make images builds them,
// tagged with the release's version).
func checkInstallByImport(t *testing.T, res *Result) {
	t.Helper()
	r := res.Images[slices.IndexFunc(res.Images, func(r Released) bool { return r.Name == "linkerd-cni" })]
	img, err := images.Find("linkerd-cni")
	if err != nil {
		t.Fatal(err)
	}
	if got := archiveName(t, r.Archive); got != img.Ref(testVersion) {
		t.Fatalf("%s imports as %q, want %s", r.Archive, got, img.Ref(testVersion))
	}
	lines := checkoutBlock(t, "make images ")
	if !slices.Contains(lines, "make images IMAGE_TAG=$TAG") || !slices.ContainsFunc(lines, func(l string) bool {
		return strings.HasPrefix(l, "ctr -n k8s.io images import bin/images/linkerd-cni.tar")
	}) {
		t.Errorf("the per-node block %q: want make images IMAGE_TAG=$TAG and ctr -n k8s.io images import bin/images/linkerd-cni.tar", lines)
	}
	// The tag the doc gives, and what helm renders for it.
	args := helmArgs(t, lines, strings.NewReplacer())
	cmd := exec.Command("bash", "-c", strings.Join(slices.DeleteFunc(slices.Clone(lines), func(l string) bool { return !strings.HasPrefix(l, "TAG=") }), "\n")+"\necho $TAG")
	cmd.Dir = repoRoot
	tag, err := cmd.Output()
	if err != nil || strings.TrimSpace(string(tag)) == "" {
		t.Fatalf("the doc's TAG: %q, %v", tag, err)
	}
	want := img.Ref(strings.TrimSpace(string(tag)))
	for _, got := range renderWithSets(t, args) {
		if got != want {
			t.Errorf("the DaemonSet runs %s, want %s, the name make images IMAGE_TAG=$TAG gives the imported image", got, want)
		}
	}
}
