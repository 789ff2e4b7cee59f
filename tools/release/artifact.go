package release

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// emptyConfig is the OCI empty descriptor's content, the configuration of an artifact that has
// none.
var emptyConfig = []byte("{}")

// blob is the layer of an artifact.
type blob struct {
	data        []byte
	mediaType   types.MediaType
	annotations map[string]string
}

// artifact is an OCI image manifest whose layer is not a file system (an SBOM, a signature),
// as a v1.Image so that go-containerregistry's remote.Write pushes it, its subject's referrers
// (or the referrers tag where a registry lacks the API) included.
type artifact struct {
	config, raw []byte
	layer       v1.Layer
	manifest    v1.Manifest
}

// newArtifact builds the manifest: artifactType, a configuration (configType over config, the
// empty descriptor when config is nil), b as its one layer, an optional subject.
func newArtifact(artifactType string, configType types.MediaType, config []byte, b blob, subject *v1.Descriptor) (v1.Image, error) {
	if config == nil {
		config, configType = emptyConfig, types.OCIEmptyJSON
	}
	h, size, err := v1.SHA256(bytes.NewReader(config))
	if err != nil {
		return nil, err
	}
	a := &artifact{config: config, layer: static.NewLayer(b.data, b.mediaType)}
	d, err := a.layer.Digest()
	if err != nil {
		return nil, err
	}
	a.manifest = v1.Manifest{
		SchemaVersion: 2,
		MediaType:     types.OCIManifestSchema1,
		ArtifactType:  artifactType,
		Config:        v1.Descriptor{MediaType: configType, Digest: h, Size: size},
		Layers: []v1.Descriptor{{
			MediaType: b.mediaType, Digest: d, Size: int64(len(b.data)), Annotations: b.annotations,
		}},
		Subject: subject,
	}
	if a.raw, err = json.Marshal(a.manifest); err != nil {
		return nil, err
	}
	return partial.CompressedToImage(a)
}

func (a *artifact) RawConfigFile() ([]byte, error)      { return a.config, nil }
func (a *artifact) MediaType() (types.MediaType, error) { return a.manifest.MediaType, nil }
func (a *artifact) RawManifest() ([]byte, error)        { return a.raw, nil }

func (a *artifact) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	switch h {
	case a.manifest.Config.Digest:
		return static.NewLayer(a.config, a.manifest.Config.MediaType), nil
	case a.manifest.Layers[0].Digest:
		return a.layer, nil
	}
	return nil, fmt.Errorf("artifact has no blob %s", h)
}

// splitTag splits repository:tag (a tag after the last slash).
func splitTag(ref string) (repo, tag string) {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i], ref[i+1:]
	}
	return ref, ""
}
