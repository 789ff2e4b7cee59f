package release

// Verification of what Sign writes, as `cosign verify --key` does it: the tests hold the
// signatures to that. Users verify with cosign itself (docs/images.md).

import (
	"bytes"
	"context"
	"crypto"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
	"github.com/sigstore/sigstore/pkg/signature"
	"github.com/sigstore/sigstore/pkg/signature/payload"
)

// isNotFound says whether a registry answered 404.
func isNotFound(err error) bool {
	var te *transport.Error
	return errors.As(err, &te) && te.StatusCode == http.StatusNotFound
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
