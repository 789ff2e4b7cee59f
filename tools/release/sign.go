package release

import (
	"bytes"
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// Cosign's key-based signature format, which `cosign verify --key` reads (cosign 2, and cosign 3,
// which detects it): the image `<repository>:sha256-<hex>.sig` holds one layer per signature, its
// blob the simple-signing payload naming the repository and the signed digest, its annotation
// the base64 signature of that payload.
const (
	SimpleSigningMediaType types.MediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	AnnotationSignature    string          = "dev.cosignproject.cosign/signature" // an annotation key, not a media type
)

// Signer signs image digests with a private key.
type Signer struct {
	sv signature.SignerVerifier
}

// LoadSigner reads a PEM private key: cosign's own (`cosign generate-key-pair`, encrypted with
// password, which may be empty) or a plain PKCS#8, SEC 1 or PKCS#1 key.
func LoadSigner(file string, password []byte) (*Signer, error) {
	sv, err := signature.LoadSignerVerifierFromPEMFile(file, crypto.SHA256, func(bool) ([]byte, error) { return password, nil })
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w (a cosign key needs its password in COSIGN_PASSWORD)", file, err)
	}
	return &Signer{sv: sv}, nil
}

// PublicKeyPEM is the key `cosign verify --key` takes.
func (s *Signer) PublicKeyPEM() ([]byte, error) {
	pub, err := s.sv.PublicKey()
	if err != nil {
		return nil, err
	}
	return cryptoutils.MarshalPublicKeyToPEM(pub)
}

// signatureTag is where cosign keeps the signatures of d.
func signatureTag(d name.Digest) name.Tag {
	return d.Context().Tag(strings.Replace(d.DigestStr(), ":", "-", 1) + ".sig")
}

// Sign signs the image d and pushes the signature to d's repository, replacing the signatures
// there were (one release, one signature).
func (s *Signer) Sign(ctx context.Context, d name.Digest, opts ...remote.Option) (name.Tag, error) {
	body, err := json.Marshal(payload.Cosign{Image: d})
	if err != nil {
		return name.Tag{}, err
	}
	sig, err := s.sv.SignMessage(bytes.NewReader(body))
	if err != nil {
		return name.Tag{}, fmt.Errorf("sign %s: %w", d, err)
	}
	// The image cosign itself writes: its configuration names the payload as the one layer, which
	// registries that insist on an image configuration take.
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	img, err := mutate.Append(base, mutate.Addendum{
		Layer:       static.NewLayer(body, SimpleSigningMediaType),
		Annotations: map[string]string{AnnotationSignature: base64.StdEncoding.EncodeToString(sig)},
	})
	if err != nil {
		return name.Tag{}, err
	}
	tag := signatureTag(d)
	if err := remote.Write(tag, img, append(opts, remote.WithContext(ctx))...); err != nil {
		return name.Tag{}, fmt.Errorf("push the signature of %s: %w", d, err)
	}
	return tag, nil
}
