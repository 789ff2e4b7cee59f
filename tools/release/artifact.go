package release

import (
	"bytes"
	"encoding/json"
	"fmt"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// emptyConfig is the OCI empty descriptor's content, the configuration of an artifact that has
// none.
var emptyConfig = []byte("{}")

// artifact is an OCI image manifest whose one layer is not a file system (an SBOM), as a
// v1.Image so that go-containerregistry's remote.Write pushes it, its subject's referrers (or
// the referrers tag where a registry lacks the API) included.
type artifact struct {
	raw      []byte
	layer    v1.Layer
	manifest v1.Manifest
}

// newArtifact builds the manifest: data as its layer, of mediaType (the artifact's type too),
// the empty configuration, and subject.
func newArtifact(mediaType types.MediaType, data []byte, subject *v1.Descriptor) (v1.Image, error) {
	h, size, err := v1.SHA256(bytes.NewReader(emptyConfig))
	if err != nil {
		return nil, err
	}
	a := &artifact{layer: static.NewLayer(data, mediaType)}
	d, err := a.layer.Digest()
	if err != nil {
		return nil, err
	}
	a.manifest = v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  string(mediaType),
		Config:        v1.Descriptor{MediaType: types.OCIEmptyJSON, Digest: h, Size: size},
		Layers:        []v1.Descriptor{{MediaType: mediaType, Digest: d, Size: int64(len(data))}},
		Subject:       subject,
	}
	if a.raw, err = json.Marshal(a.manifest); err != nil {
		return nil, err
	}
	return partial.CompressedToImage(a)
}

func (a *artifact) RawConfigFile() ([]byte, error)      { return emptyConfig, nil }
func (a *artifact) MediaType() (types.MediaType, error) { return a.manifest.MediaType, nil }
func (a *artifact) RawManifest() ([]byte, error)        { return a.raw, nil }

func (a *artifact) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	switch h {
	case a.manifest.Config.Digest:
		return static.NewLayer(emptyConfig, types.OCIEmptyJSON), nil
	case a.manifest.Layers[0].Digest:
		return a.layer, nil
	}
	return nil, fmt.Errorf("artifact has no blob %s", h)
}
