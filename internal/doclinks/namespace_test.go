package doclinks

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// namespaceLabels are the labels of deploy/linkerd-cni/00-namespace.yaml, the chart's Namespace.
func namespaceLabels(t *testing.T, root string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "linkerd-cni", "00-namespace.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var ns struct {
		Metadata struct {
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
	}
	if err := yaml.Unmarshal(b, &ns); err != nil {
		t.Fatal(err)
	}
	if len(ns.Metadata.Labels) == 0 {
		t.Fatal("deploy/linkerd-cni/00-namespace.yaml has no labels")
	}
	return ns.Metadata.Labels
}

// fencedBlocks returns each fenced code block of md with the line number of its first line.
func fencedBlocks(md string) (blocks [][]string, starts []int) {
	var cur []string
	in := false
	for i, line := range strings.Split(md, "\n") {
		if isFence(line) {
			if in {
				blocks = append(blocks, cur)
			} else {
				cur, starts = nil, append(starts, i+2)
			}
			in = !in
			continue
		}
		if in {
			cur = append(cur, strings.TrimSpace(line))
		}
	}
	return blocks, starts
}

// TestHelmInstallsLabelTheNamespace: no page installs our chart with `helm install
// --create-namespace`, which makes the namespace without the labels Pod Security and `linkerd
// check` need, and every `helm install` of the chart in a page's command block follows, in that
// block, the namespace's creation with exactly the chart's Namespace labels (or an apply of that
// Namespace), so a reader who copies one block gets a namespace the DaemonSet can run in.
func TestHelmInstallsLabelTheNamespace(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	want := namespaceLabels(t, root)
	pages := []string{"README.md", "CONTRIBUTING.md"}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	for _, d := range docs {
		pages = append(pages, filepath.Join("docs", filepath.Base(d)))
	}
	installs := 0
	for _, page := range pages {
		b, err := os.ReadFile(filepath.Join(root, page))
		if err != nil {
			t.Fatal(err)
		}
		blocks, starts := fencedBlocks(string(b))
		for bi, block := range blocks {
			created, labelled, applied := false, false, false
			for li, line := range block {
				at := page + ":" + strconv.Itoa(starts[bi]+li)
				if strings.Contains(line, "--create-namespace") {
					t.Errorf("%s: %q: create and label the namespace first instead of --create-namespace", at, line)
				}
				switch {
				case line == "kubectl create namespace linkerd-cni":
					created = true
				case line == "kubectl apply -f deploy/linkerd-cni/00-namespace.yaml":
					applied = true
				case strings.HasPrefix(line, "kubectl label namespace linkerd-cni "):
					got := map[string]string{}
					for _, kv := range strings.Fields(strings.TrimPrefix(line, "kubectl label namespace linkerd-cni ")) {
						k, v, _ := strings.Cut(kv, "=")
						got[k] = v
					}
					if !maps.Equal(got, want) {
						t.Errorf("%s: labels %v, want those of deploy/linkerd-cni/00-namespace.yaml: %v", at, got, want)
					}
					labelled = true
				case strings.HasPrefix(line, "helm install ") && strings.Contains(line, "linkerd2-cni"):
					installs++
					if !applied && !(created && labelled) {
						t.Errorf("%s: %q is not preceded in its block by `kubectl create namespace linkerd-cni` and `kubectl label namespace linkerd-cni %s` (or `kubectl apply -f deploy/linkerd-cni/00-namespace.yaml`)",
							at, line, labelArgs(want))
					}
				}
			}
		}
	}
	if installs == 0 {
		t.Error("no page has a `helm install` of the chart: the check found nothing to check")
	}
	// The chart's own comments name no --create-namespace either.
	filepath.WalkDir(filepath.Join(root, "deploy", "charts"), func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if b, _ := os.ReadFile(p); strings.Contains(string(b), "--create-namespace") {
			rel, _ := filepath.Rel(root, p)
			t.Errorf("%s names --create-namespace", rel)
		}
		return nil
	})
}

func labelArgs(labels map[string]string) string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		out = append(out, k+"="+labels[k])
	}
	return strings.Join(out, " ")
}
