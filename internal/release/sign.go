package release

import (
	"bytes"
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
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
	AnnotationSignature                    = "dev.cosignproject.cosign/signature"
)

// Signer signs image digests with a private key.
type Signer struct {
	sv signature.SignerVerifier
}

// LoadSigner reads a PEM private key: cosign's own (`cosign generate-key-pair`, encrypted with
// password, which may be empty) or a plain PKCS#8, SEC 1 or PKCS#1 key.
func LoadSigner(file string, password []byte) (*Signer, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	priv, err := cryptoutils.UnmarshalPEMToPrivateKey(b, func(bool) ([]byte, error) { return password, nil })
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w (a cosign key needs its password in COSIGN_PASSWORD)", file, err)
	}
	sv, err := signature.LoadSignerVerifier(priv, crypto.SHA256)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", file, err)
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
	img, err := newArtifact("", types.OCIConfigJSON, signatureConfig(body), []blob{{
		data: body, mediaType: SimpleSigningMediaType,
		annotations: map[string]string{AnnotationSignature: base64.StdEncoding.EncodeToString(sig)},
	}}, nil, nil)
	if err != nil {
		return name.Tag{}, err
	}
	tag := signatureTag(d)
	if err := remote.Write(tag, img, append(opts, remote.WithContext(ctx))...); err != nil {
		return name.Tag{}, fmt.Errorf("push the signature of %s: %w", d, err)
	}
	return tag, nil
}

// signatureConfig is an image configuration naming the payload as the one layer, as cosign
// writes it: registries that insist on an image configuration take it.
func signatureConfig(body []byte) []byte {
	h, _, _ := v1.SHA256(bytes.NewReader(body))
	b, _ := json.Marshal(map[string]any{
		"architecture": "", "os": "", "config": map[string]any{},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{h.String()}},
	})
	return b
}

// LoadVerifier reads a PEM public key (cosign.pub).
func LoadVerifier(file string) (signature.Verifier, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("public key: %w", err)
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(b)
	if err != nil {
		return nil, fmt.Errorf("public key %s: %w", file, err)
	}
	return signature.LoadVerifier(pub, crypto.SHA256)
}

// ErrNoSignature says that d has no signature at all.
var ErrNoSignature = errors.New("no signature")

// Verify checks, as `cosign verify --key` does, that a signature of d's repository verifies with
// v and that its payload names d's digest.
func Verify(ctx context.Context, d name.Digest, v signature.Verifier, opts ...remote.Option) error {
	img, err := remote.Image(signatureTag(d), append(opts, remote.WithContext(ctx))...)
	if isNotFound(err) {
		return fmt.Errorf("%s: %w", d, ErrNoSignature)
	}
	if err != nil {
		return fmt.Errorf("read the signatures of %s: %w", d, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return err
	}
	var problems []string
	for _, l := range m.Layers {
		if l.MediaType != SimpleSigningMediaType {
			continue
		}
		sig, err := base64.StdEncoding.DecodeString(l.Annotations[AnnotationSignature])
		if err != nil {
			problems = append(problems, fmt.Sprintf("layer %s: signature annotation: %v", l.Digest, err))
			continue
		}
		layer, err := img.LayerByDigest(l.Digest)
		if err != nil {
			return err
		}
		rc, err := layer.Compressed()
		if err != nil {
			return err
		}
		body, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return err
		}
		if err := v.VerifySignature(bytes.NewReader(sig), bytes.NewReader(body)); err != nil {
			problems = append(problems, fmt.Sprintf("layer %s: %v", l.Digest, err))
			continue
		}
		var p payload.Cosign
		if err := json.Unmarshal(body, &p); err != nil {
			problems = append(problems, fmt.Sprintf("layer %s: payload: %v", l.Digest, err))
			continue
		}
		if p.Image.DigestStr() != d.DigestStr() || p.Image.Context().Name() != d.Context().Name() {
			problems = append(problems, fmt.Sprintf("layer %s: signs %s, not %s", l.Digest, p.Image, d))
			continue
		}
		return nil
	}
	if len(problems) == 0 {
		return fmt.Errorf("%s: %w", d, ErrNoSignature)
	}
	return fmt.Errorf("%s: no signature verifies: %s", d, strings.Join(problems, "; "))
}
