package release

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/kubemesh/proxy-init/tools/images"
)

// LinkerdPaths are the programs Linkerd 2.20's linkerd-control-plane chart runs from the proxy
// image by path: the linkerd-init container's proxy-init and CNI mode's network validator. The
// overlay replaces both; a base without them is not a 2.20 proxy image.
var LinkerdPaths = []string{"/usr/lib/linkerd/linkerd2-proxy-init", "/usr/lib/linkerd/linkerd2-network-validator"}

// The overlay records its base in OCI's own annotations, on the index and on every image.
const (
	AnnotationBaseDigest = "org.opencontainers.image.base.digest"
	AnnotationBaseName   = "org.opencontainers.image.base.name"
)

// dockerReferenceType marks BuildKit's attestation manifests in an index.
const dockerReferenceType = "vnd.docker.reference.type"

// OverlayOptions say what to put over which base, and where to push it.
type OverlayOptions struct {
	// Base is Linkerd's proxy image: a registry reference, or the path of an OCI image layout
	// (a directory) or of an OCI archive (a tar of one, as `make images` writes).
	Base string
	// Target is the registry reference to push to.
	Target string
	// BinDir holds the binaries of each platform in images.PlatformBinDir(BinDir, platform).
	BinDir string
	// Platforms are those we build; a base platform outside them is refused.
	Platforms []string
	// Epoch stamps the layer's files and its history entry; Version (ours) is in the latter.
	Epoch   time.Time
	Version string
	// Remote are go-containerregistry's options for the registries (authentication, transport).
	Remote []remote.Option
}

// Overlaid is what Overlay built and pushed.
type Overlaid struct {
	// Base is the digest of the base (its index, or its image), Ref what was pushed.
	Base      v1.Hash
	Ref       name.Digest
	Platforms []OverlaidPlatform
	// Dropped are the base index's attestation manifests, left out: they attest the base's
	// images, not ours.
	Dropped []v1.Descriptor
}

// OverlaidPlatform is one platform of the result.
type OverlaidPlatform struct {
	Platform     v1.Platform
	Base, Digest v1.Hash
}

// Overlay puts our proxy-init and validator (images.Overlay) over every platform of Linkerd's
// proxy image as one more layer, keeping everything else of the base (its layers, entrypoint,
// user, environment, labels, annotations, and each platform of an index), records the base in
// AnnotationBaseDigest and AnnotationBaseName, and pushes the result to o.Target. Nothing is
// pushed unless every platform of the base is one we build and holds LinkerdPaths and its
// entrypoint; every problem is reported at once.
func Overlay(ctx context.Context, o OverlayOptions) (*Overlaid, error) {
	target, err := name.ParseReference(o.Target)
	if err != nil {
		return nil, fmt.Errorf("target %q: %w", o.Target, err)
	}
	opts := append(slices.Clone(o.Remote), remote.WithContext(ctx))
	idx, img, cleanup, err := openBase(o.Base, opts)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	res := &Overlaid{}
	var out interface {
		remote.Taggable
		Digest() (v1.Hash, error)
	}
	if img != nil {
		if res.Base, err = img.Digest(); err != nil {
			return nil, fmt.Errorf("base %s: %w", o.Base, err)
		}
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("base %s: %w", o.Base, err)
		}
		single, p, err := overlayImage(img, cf.Platform(), res.Base, o)
		if err != nil {
			return nil, err
		}
		res.Platforms, out = append(res.Platforms, p), single
	} else if out, err = overlayIndex(idx, res, o); err != nil {
		return nil, err
	}
	if err := remote.Push(target, out, opts...); err != nil {
		return nil, fmt.Errorf("push %s: %w", target, err)
	}
	d, err := out.Digest()
	if err != nil {
		return nil, err
	}
	res.Ref = target.Context().Digest(d.String())
	return res, nil
}

// overlayIndex builds the overlay of every platform of idx, in the index's order.
func overlayIndex(idx v1.ImageIndex, res *Overlaid, o OverlayOptions) (v1.ImageIndex, error) {
	var err error
	if res.Base, err = idx.Digest(); err != nil {
		return nil, fmt.Errorf("base %s: %w", o.Base, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("base %s: %w", o.Base, err)
	}
	var adds []mutate.IndexAddendum
	var problems []string
	for _, desc := range im.Manifests {
		if desc.Annotations[dockerReferenceType] == "attestation-manifest" || (desc.Platform != nil && desc.Platform.OS == "unknown") {
			res.Dropped = append(res.Dropped, desc)
			continue
		}
		if !desc.MediaType.IsImage() || desc.Platform == nil {
			problems = append(problems, fmt.Sprintf("entry %s (%s) is not an image of a platform", desc.Digest, desc.MediaType))
			continue
		}
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return nil, fmt.Errorf("base %s: %s: %w", o.Base, desc.Digest, err)
		}
		out, p, err := overlayImage(img, desc.Platform, desc.Digest, o)
		if err != nil {
			problems = append(problems, err.Error())
			continue
		}
		res.Platforms = append(res.Platforms, p)
		adds = append(adds, mutate.IndexAddendum{Add: out, Descriptor: v1.Descriptor{
			Platform: desc.Platform, Annotations: desc.Annotations, URLs: desc.URLs,
		}})
	}
	if len(problems) > 0 {
		return nil, fmt.Errorf("base %s: %s; nothing pushed", o.Base, strings.Join(problems, "; "))
	}
	if len(adds) == 0 {
		return nil, fmt.Errorf("base %s: no image in the index; nothing pushed", o.Base)
	}
	mt := cmp.Or(im.MediaType, types.OCIImageIndex)
	out := mutate.AppendManifests(mutate.IndexMediaType(empty.Index, mt), adds...)
	return mutate.Annotations(out, withBase(im.Annotations, res.Base, o.Base)).(v1.ImageIndex), nil
}

// withBase is a copy of ann that records the base in AnnotationBaseDigest and AnnotationBaseName.
func withBase(ann map[string]string, digest v1.Hash, base string) map[string]string {
	out := map[string]string{}
	maps.Copy(out, ann)
	out[AnnotationBaseDigest], out[AnnotationBaseName] = digest.String(), base
	return out
}

// overlayImage appends our layer to one platform's image, once it has checked the platform and
// Linkerd's paths.
func overlayImage(img v1.Image, p *v1.Platform, baseDigest v1.Hash, o OverlayOptions) (v1.Image, OverlaidPlatform, error) {
	if p == nil {
		return nil, OverlaidPlatform{}, fmt.Errorf("base %s: the image names no platform", o.Base)
	}
	// arm64's v8 variant is plain arm64.
	plat := p.OS + "/" + p.Architecture
	if v := p.Variant; v != "" && (p.Architecture != "arm64" || v != "v8") {
		plat += "/" + v
	}
	if !slices.Contains(o.Platforms, plat) {
		return nil, OverlaidPlatform{}, fmt.Errorf("platform %s is not one we build (%s)", p, strings.Join(o.Platforms, ", "))
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, OverlaidPlatform{}, fmt.Errorf("%s: %w", plat, err)
	}
	need := slices.Clone(LinkerdPaths)
	if ep := cf.Config.Entrypoint; len(ep) > 0 && path.IsAbs(ep[0]) {
		need = append(need, ep[0])
	}
	missing, err := missingPaths(img, need)
	if err != nil {
		return nil, OverlaidPlatform{}, fmt.Errorf("%s: %w", plat, err)
	}
	if len(missing) > 0 {
		return nil, OverlaidPlatform{}, fmt.Errorf("%s lacks %s, which Linkerd 2.20's chart runs: is it Linkerd's proxy image, 2.20 or later?", plat, strings.Join(missing, ", "))
	}
	bin := images.PlatformBinDir(o.BinDir, plat)
	arch, err := images.GoArch(filepath.Join(bin, images.BinProxyInit))
	if err != nil {
		return nil, OverlaidPlatform{}, fmt.Errorf("%s: %w (make platform-bins)", plat, err)
	}
	if arch != p.Architecture {
		return nil, OverlaidPlatform{}, fmt.Errorf("%s: the binaries in %s are for %s", plat, bin, arch)
	}
	layerTar, err := images.Layer(images.Overlay, images.Inputs{BinDir: bin, Epoch: o.Epoch})
	if err != nil {
		return nil, OverlaidPlatform{}, err
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, OverlaidPlatform{}, err
	}
	layerType := types.OCILayer
	if m.MediaType == types.DockerManifestSchema2 {
		layerType = types.DockerLayer
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(layerType))
	if err != nil {
		return nil, OverlaidPlatform{}, err
	}
	out, err := mutate.Append(img, mutate.Addendum{Layer: layer, MediaType: layerType, History: v1.History{
		Created:   v1.Time{Time: o.Epoch},
		CreatedBy: "kubemesh proxy-init " + o.Version + " overlay: " + strings.Join(LinkerdPaths, ", "),
	}})
	if err != nil {
		return nil, OverlaidPlatform{}, err
	}
	out = mutate.Annotations(out, withBase(m.Annotations, baseDigest, o.Base)).(v1.Image)
	d, err := out.Digest()
	if err != nil {
		return nil, OverlaidPlatform{}, err
	}
	return out, OverlaidPlatform{Platform: *p, Base: baseDigest, Digest: d}, nil
}

// missingPaths returns those of paths that the image's file system (its layers applied in
// order, whiteouts included) does not hold.
func missingPaths(img v1.Image, paths []string) ([]string, error) {
	rc := mutate.Extract(img)
	defer rc.Close()
	have := map[string]bool{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read the file system: %w", err)
		}
		have[path.Clean("/"+h.Name)] = true
	}
	return slices.DeleteFunc(slices.Clone(paths), func(p string) bool { return have[p] }), nil
}

// openBase opens the base: an index, or a single image. cleanup removes what reading a local
// archive unpacked.
func openBase(ref string, opts []remote.Option) (idx v1.ImageIndex, img v1.Image, cleanup func(), err error) {
	cleanup = func() {}
	fi, statErr := os.Stat(ref)
	if statErr != nil {
		// A missing file must not become a request to a default registry.
		if strings.HasPrefix(ref, "/") || strings.HasPrefix(ref, ".") || strings.HasSuffix(ref, ".tar") {
			return nil, nil, cleanup, fmt.Errorf("base %s: %w", ref, statErr)
		}
		r, err := name.ParseReference(ref)
		if err != nil {
			return nil, nil, cleanup, fmt.Errorf("base %q is neither a file nor a registry reference: %w", ref, err)
		}
		desc, err := remote.Get(r, opts...)
		if err != nil {
			return nil, nil, cleanup, fmt.Errorf("base %s: %w", ref, err)
		}
		if desc.MediaType.IsIndex() {
			idx, err = desc.ImageIndex()
		} else {
			img, err = desc.Image()
		}
		return idx, img, cleanup, err
	}
	defer func() {
		if err != nil {
			cleanup()
			err = fmt.Errorf("base %s: %w", ref, err)
		}
	}()
	dir := ref
	if !fi.IsDir() {
		tmp, err := os.MkdirTemp("", "overlay-base-")
		if err != nil {
			return nil, nil, cleanup, err
		}
		dir, cleanup = filepath.Join(tmp, "layout"), func() { os.RemoveAll(tmp) }
		data, err := os.ReadFile(ref)
		if err != nil {
			return nil, nil, cleanup, err
		}
		if err := images.Unpack(dir, data); err != nil {
			return nil, nil, cleanup, fmt.Errorf("not an OCI archive: %w", err)
		}
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, nil, cleanup, fmt.Errorf("not an OCI image layout: %w", err)
	}
	top, err := p.ImageIndex()
	if err != nil {
		return nil, nil, cleanup, err
	}
	im, err := top.IndexManifest()
	if err != nil {
		return nil, nil, cleanup, err
	}
	if len(im.Manifests) != 1 {
		return nil, nil, cleanup, fmt.Errorf("the layout holds %d entries, want one image or index", len(im.Manifests))
	}
	if d := im.Manifests[0]; d.MediaType.IsIndex() {
		idx, err = top.ImageIndex(d.Digest)
	} else {
		img, err = top.Image(d.Digest)
	}
	return idx, img, cleanup, err
}
