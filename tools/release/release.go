// Package release builds and publishes what a user pulls: the images for every platform (OCI
// archives, and pushed as indexes), one SPDX SBOM per platform image (written beside the
// archives, and pushed as an OCI referrer of that image), cosign-compatible key-based
// signatures of every image and SBOM digest, the linkerd2-cni chart as a Helm package (and
// pushed as an OCI artifact with Helm's library, its manifest signed too), and a SHA256SUMS of
// it all (`make release`). It also puts our binaries over Linkerd's proxy image without a
// container daemon (Overlay, `make overlay`).
//
// Limits: signatures are cosign's key-based format, not keyless, and are not recorded in a
// transparency log (`cosign verify` needs --insecure-ignore-tlog); a release replaces the
// signatures a digest had; the files of the release directory (binaries, SHA256SUMS) are not
// signed. SBOMs list Go modules and Debian packages, not licenses.
//
// Tests: docs/images.md#tests.
package release

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/kubemesh/proxy-init/tools/chart"
	"github.com/kubemesh/proxy-init/tools/images"
)

// Options say what to release, and where.
type Options struct {
	// Version is the release, vX.Y.Z: the images' tag, the chart's version and default image tag.
	Version string
	// BinDir holds each platform's binaries (images.PlatformBinDir), built with Version.
	BinDir    string
	Platforms []string
	// Out is the release directory (bin/release).
	Out      string
	RepoDir  string
	DebCache string
	Epoch    time.Time
	// Registry is host[:port]/namespace to push to; "" pushes nothing.
	Registry string
	// KeyFile signs every image, SBOM and chart digest when set (it needs Registry); Password
	// decrypts a cosign key.
	KeyFile  string
	Password []byte
	// Remote are go-containerregistry's options for the registry (authentication, transport).
	Remote []remote.Option
	Logf   func(format string, a ...any)
}

// Result is what a release wrote and pushed.
type Result struct {
	Images []Released
	// Chart is the package; ChartRef where it was pushed (oci://…), if it was, and ChartDigest
	// its manifest's digest, when signed.
	Chart, ChartRef string
	ChartDigest     name.Digest
	// PublicKey is the signing key's public half (cosign.pub), when signed.
	PublicKey string
	Sums      string
}

// Released is one image of a release.
type Released struct {
	Name, Ref string // Ref is repository:tag
	Digest    v1.Hash
	Archive   string
	Platforms []ReleasedPlatform
	built     *images.Built
}

// ReleasedPlatform is one platform's image.
type ReleasedPlatform struct {
	Platform string
	Digest   v1.Hash
	// SBOM is the document's path; Size the image's compressed size (what a node pulls).
	SBOM string
	Size int64
}

// Files of the release directory.
const (
	SumsFile      = "SHA256SUMS"
	DigestsFile   = "images.txt"
	PublicKeyFile = "cosign.pub"
	ImagesDir     = "images"
)

// Run builds the release into o.Out and, when o.Registry is set, pushes it. Everything is
// checked before anything is pushed: the version, the registry's name, the signing key.
func Run(ctx context.Context, o Options) (*Result, error) {
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	chartVersion, err := chart.Version(o.Version)
	if err != nil {
		return nil, err
	}
	chartImage := ""
	if o.Registry != "" {
		chartImage = o.Registry + "/linkerd-cni"
		if _, err := name.NewRepository(chartImage); err != nil {
			return nil, fmt.Errorf("registry %q: want host[:port]/namespace: %w", o.Registry, err)
		}
	}
	var signer *Signer
	if o.KeyFile != "" {
		if o.Registry == "" {
			return nil, fmt.Errorf("signing key %s given without a registry: signatures are pushed beside the images (REGISTRY=host[:port]/namespace)", o.KeyFile)
		}
		if signer, err = LoadSigner(o.KeyFile, o.Password); err != nil {
			return nil, err
		}
	}
	// A release directory holds this release only: what an earlier one wrote goes.
	old, _ := filepath.Glob(filepath.Join(o.Out, "*.tgz"))
	for _, p := range append(old, filepath.Join(o.Out, ImagesDir), filepath.Join(o.Out, SumsFile), filepath.Join(o.Out, DigestsFile), filepath.Join(o.Out, PublicKeyFile)) {
		if err := os.RemoveAll(p); err != nil {
			return nil, err
		}
	}
	imgDir := filepath.Join(o.Out, ImagesDir)
	if err := os.MkdirAll(imgDir, 0o755); err != nil {
		return nil, err
	}
	res := &Result{}
	in := images.Inputs{BinDir: o.BinDir, RepoDir: o.RepoDir, DebCache: o.DebCache, Epoch: o.Epoch}
	var digests strings.Builder
	for _, img := range images.Images {
		if o.Registry != "" {
			img.Repository = o.Registry + "/" + path.Base(img.Repository)
		}
		archive := filepath.Join(imgDir, img.Name+".tar")
		b, err := images.BuildOCI(archive, img, o.Version, o.Platforms, in)
		if err != nil {
			return nil, err
		}
		d, err := b.Index.Digest()
		if err != nil {
			return nil, err
		}
		r := Released{Name: img.Name, Ref: img.Ref(o.Version), Digest: d, Archive: archive, built: b}
		for _, pi := range b.Platforms {
			rp, err := writeSBOM(imgDir, b, pi, o)
			if err != nil {
				return nil, err
			}
			r.Platforms = append(r.Platforms, rp)
		}
		logf("built %s (%s) %s", r.Ref, d, archive)
		fmt.Fprintf(&digests, "%s@%s\n", r.Ref, d)
		res.Images = append(res.Images, r)
	}
	if err := os.WriteFile(filepath.Join(o.Out, DigestsFile), []byte(digests.String()), 0o644); err != nil {
		return nil, err
	}
	if res.Chart, err = chart.Package(o.RepoDir, o.Out, o.Version, chartImage); err != nil {
		return nil, err
	}
	logf("packaged chart %s %s", chartVersion, res.Chart)
	if signer != nil {
		pub, err := signer.PublicKeyPEM()
		if err != nil {
			return nil, err
		}
		res.PublicKey = filepath.Join(o.Out, PublicKeyFile)
		if err := os.WriteFile(res.PublicKey, pub, 0o644); err != nil {
			return nil, err
		}
	}
	if res.Sums, err = writeSums(o.Out); err != nil {
		return nil, err
	}
	if o.Registry == "" {
		return res, nil
	}
	opts := append(slices.Clone(o.Remote), remote.WithContext(ctx))
	for _, r := range res.Images {
		if err := push(ctx, r, signer, opts, logf); err != nil {
			return nil, err
		}
	}
	ref, digest, err := chart.Push(res.Chart, o.Registry, o.Epoch)
	if err != nil {
		return nil, err
	}
	res.ChartRef = "oci://" + ref
	logf("pushed chart %s@%s", res.ChartRef, digest)
	if signer != nil {
		// ref is REPO/NAME:VERSION.
		if res.ChartDigest, err = name.NewDigest(ref[:strings.LastIndex(ref, ":")] + "@" + digest); err != nil {
			return nil, err
		}
		if _, err := signer.Sign(ctx, res.ChartDigest, opts...); err != nil {
			return nil, err
		}
		logf("signed the chart")
	}
	return res, nil
}

// push pushes one image's index, each platform's SBOM as its referrer, and the signatures of
// the index, of each platform's image and of each SBOM.
func push(ctx context.Context, r Released, signer *Signer, opts []remote.Option, logf func(string, ...any)) error {
	tag, err := name.NewTag(r.Ref)
	if err != nil {
		return err
	}
	b := r.built
	if err := remote.WriteIndex(tag, b.Index, opts...); err != nil {
		return fmt.Errorf("push %s: %w", r.Ref, err)
	}
	logf("pushed %s@%s", r.Ref, r.Digest)
	signed := []v1.Hash{r.Digest}
	for i, pi := range b.Platforms {
		rp := r.Platforms[i]
		data, err := os.ReadFile(rp.SBOM)
		if err != nil {
			return err
		}
		desc, err := partial.Descriptor(pi.Image)
		if err != nil {
			return err
		}
		subject := &v1.Descriptor{MediaType: desc.MediaType, Digest: desc.Digest, Size: desc.Size}
		art, err := newArtifact(SBOMArtifactType, data, subject)
		if err != nil {
			return err
		}
		ad, err := art.Digest()
		if err != nil {
			return err
		}
		if err := remote.Write(tag.Context().Digest(ad.String()), art, opts...); err != nil {
			return fmt.Errorf("push the SBOM of %s (%s): %w", r.Ref, rp.Platform, err)
		}
		logf("pushed the SBOM of %s %s as a referrer of %s", r.Ref, rp.Platform, rp.Digest)
		// The SBOM's manifest is signed too: its digest covers the document, so `cosign verify
		// --key` on it proves the SBOM is the release's, as it does for the image.
		signed = append(signed, rp.Digest, ad)
	}
	if signer == nil {
		return nil
	}
	for _, d := range signed {
		if _, err := signer.Sign(ctx, tag.Context().Digest(d.String()), opts...); err != nil {
			return err
		}
	}
	logf("signed %s: the index, %d platform images and their SBOMs", r.Ref, len(b.Platforms))
	return nil
}

// writeSums writes SHA256SUMS (sha256sum's format) of every other file under dir, and returns
// its path.
func writeSums(dir string) (string, error) {
	var files []string
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && p != filepath.Join(dir, SumsFile) {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		return "", err
	}
	sort.Strings(files)
	var b strings.Builder
	for _, p := range files {
		data, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(&b, "%x  %s\n", sha256.Sum256(data), filepath.ToSlash(rel))
	}
	out := filepath.Join(dir, SumsFile)
	return out, os.WriteFile(out, []byte(b.String()), 0o644)
}
