package e2e

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path"
	"strings"
)

// imageFile is one regular file of a test image, copied from the host.
type imageFile struct {
	Path string // absolute path in the image
	Src  string // file on the host
	Mode int64
}

// testImage is an image the harness builds itself: static binaries in one layer, nothing else.
type testImage struct {
	Ref        string // e.g. e2e.test/pause:1, the name containerd stores it under
	Files      []imageFile
	Entrypoint []string
}

// writeOCITarball writes img as an OCI image layout in a tar file, the format
// `ctr images import` reads. The layer is an uncompressed tar, so its digest is its diff ID.
// The config carries OS and architecture, without which containerd's import skips the image.
func writeOCITarball(file string, img testImage) error {
	layer, err := layerTar(img.Files)
	if err != nil {
		return fmt.Errorf("image %s: %w", img.Ref, err)
	}
	layerDigest := digest(layer)
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": img.Entrypoint},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDigest}},
	})
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        descriptor("application/vnd.oci.image.config.v1+json", config, nil),
		"layers":        []any{descriptor("application/vnd.oci.image.layer.v1.tar", layer, nil)},
	})
	tag := img.Ref[strings.LastIndex(img.Ref, ":")+1:]
	index, _ := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests": []any{descriptor("application/vnd.oci.image.manifest.v1+json", manifest, map[string]string{
			"io.containerd.image.name":          img.Ref,
			"org.opencontainers.image.ref.name": tag,
		})},
	})

	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", index},
		{blobPath(config), config},
		{blobPath(manifest), manifest},
		{blobPath(layer), layer},
	}
	for _, e := range entries {
		if err := tw.WriteHeader(&tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), Typeflag: tar.TypeReg}); err != nil {
			return fmt.Errorf("image %s: %w", img.Ref, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return fmt.Errorf("image %s: %w", img.Ref, err)
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("image %s: %w", img.Ref, err)
	}
	if err := os.WriteFile(file, out.Bytes(), 0o644); err != nil {
		return fmt.Errorf("image %s: %w", img.Ref, err)
	}
	return nil
}

// layerTar packs files, with their parent directories, owned by root.
func layerTar(files []imageFile) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		var parents []string
		for d := path.Dir(f.Path); d != "/" && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append([]string{d}, parents...)
		}
		for _, d := range parents {
			if err := tw.WriteHeader(&tar.Header{Name: d[1:] + "/", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
				return nil, err
			}
		}
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, err
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.Path[1:], Mode: f.Mode, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

func blobPath(b []byte) string { return "blobs/sha256/" + strings.TrimPrefix(digest(b), "sha256:") }

func descriptor(mediaType string, b []byte, annotations map[string]string) map[string]any {
	d := map[string]any{"mediaType": mediaType, "digest": digest(b), "size": len(b)}
	if annotations != nil {
		d["annotations"] = annotations
	}
	return d
}
