// Package chart packages the linkerd2-cni chart (deploy/charts/linkerd2-cni) for a release and
// pushes the package to an OCI registry, for `make chart` and `make release`. Rendering the
// chart, which the product's tests also do, is test/helmchart's.
package chart

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/Masterminds/semver/v3"
	"github.com/google/go-containerregistry/pkg/name"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/registry"

	"github.com/kubemesh/proxy-init/test/helmchart"
)

// Version is the chart's version for a release version: the same SemVer without the "v"
// (v0.2.0 is chart 0.2.0), which is also the chart's tag in an OCI registry.
func Version(version string) (string, error) {
	v, ok := strings.CutPrefix(version, "v")
	if _, err := semver.StrictNewVersion(v); !ok || err != nil {
		return "", fmt.Errorf("version %q: want v and a SemVer, such as v0.2.0 or v0.2.0-rc.1", version)
	}
	return v, nil
}

// imageLine finds the top-level image: block of values.yaml, whose keys are indented by two
// spaces.
var imageLine = regexp.MustCompile(`(?m)^image:\n((?:  .*\n|\s*\n)*)`)

// setImageDefaults rewrites the default image name (when name is not "") and version in the
// text of values.yaml, keeping its comments, which `helm show values` prints.
func setImageDefaults(values []byte, name, version string) ([]byte, error) {
	loc := imageLine.FindSubmatchIndex(values)
	if loc == nil {
		return nil, fmt.Errorf("values.yaml: no top-level image: block")
	}
	block := values[loc[2]:loc[3]]
	for _, kv := range [][2]string{{"version", version}, {"name", name}} {
		if kv[1] == "" {
			continue
		}
		re := regexp.MustCompile(`(?m)^  ` + kv[0] + `: .*$`)
		if !re.Match(block) {
			return nil, fmt.Errorf("values.yaml: no image.%s", kv[0])
		}
		block = re.ReplaceAllLiteral(block, []byte("  "+kv[0]+": "+kv[1]))
	}
	return slices.Concat(values[:loc[2]], block, values[loc[3]:]), nil
}

// Package writes the chart at root as a Helm package in dir, for release version: the chart's
// version (Version) and appVersion, and its default image.version, are that release; the
// default image.name is image when not "" (a release pushed to another registry). It returns
// the package's path (dir/linkerd2-cni-VERSION.tgz).
func Package(root, dir, version, image string) (string, error) {
	cv, err := Version(version)
	if err != nil {
		return "", err
	}
	ch, err := helmchart.Load(root)
	if err != nil {
		return "", err
	}
	ch.Metadata.Version, ch.Metadata.AppVersion = cv, version
	i := slices.IndexFunc(ch.Raw, func(f *chart.File) bool { return f.Name == chartutil.ValuesfileName })
	if i < 0 {
		return "", fmt.Errorf("chart %s has no %s", helmchart.ChartDir, chartutil.ValuesfileName)
	}
	if ch.Raw[i].Data, err = setImageDefaults(ch.Raw[i].Data, image, version); err != nil {
		return "", err
	}
	// Save writes values.yaml from its text (ch.Raw), not from ch.Values, and creates dir.
	p, err := chartutil.Save(ch, dir)
	if err != nil {
		return "", fmt.Errorf("package chart %s: %w", helmchart.ChartDir, err)
	}
	return p, nil
}

// Push pushes the chart package at pkg to the OCI registry repo (host[:port]/namespace, as in
// `helm push PKG oci://REPO`) with Helm's registry client, which takes Helm's registry
// credentials and falls back to Docker's. A registry on loopback is spoken to without TLS, as
// go-containerregistry does. It returns the reference pushed, REPO/NAME:VERSION, and the
// digest of its manifest.
func Push(pkg, repo string, created time.Time) (ref, digest string, err error) {
	data, err := os.ReadFile(pkg)
	if err != nil {
		return "", "", err
	}
	repo = strings.TrimPrefix(repo, "oci://")
	reg, err := name.NewRegistry(strings.SplitN(repo, "/", 2)[0])
	if err != nil {
		return "", "", fmt.Errorf("registry %q: %w", repo, err)
	}
	var opts []registry.ClientOption
	if reg.Scheme() == "http" {
		opts = append(opts, registry.ClientOptPlainHTTP())
	}
	c, err := registry.NewClient(opts...)
	if err != nil {
		return "", "", fmt.Errorf("helm registry client: %w", err)
	}
	ch, err := loader.LoadArchive(bytes.NewReader(data))
	if err != nil {
		return "", "", fmt.Errorf("read chart package %s: %w", pkg, err)
	}
	ref = repo + "/" + ch.Name() + ":" + ch.Metadata.Version
	res, err := c.Push(data, ref, registry.PushOptCreationTime(created.UTC().Format(time.RFC3339)))
	if err != nil {
		return "", "", fmt.Errorf("push chart %s to oci://%s: %w", pkg, ref, err)
	}
	return ref, res.Manifest.Digest, nil
}
