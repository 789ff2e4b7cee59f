package e2e

import (
	"archive/tar"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/kubemesh/proxy-init/internal/cnitest"
	"github.com/kubemesh/proxy-init/internal/images"
)

// The harness's own images.
const (
	// PauseImage is the sandbox image containerd runs for every pod.
	PauseImage = "e2e.test/pause:1"
	// AgentImage holds the demo helper (internal/demo) as /agent: `/agent proxy` is a fake sidecar
	// proxy that answers every connection with its original destination (SO_ORIGINAL_DST),
	// `/agent serve` a plain server, `/agent dial HOST:PORT` a client that prints the reply.
	AgentImage = "e2e.test/agent:1"
)

// BuildTestImages builds the pause and agent images as OCI archives in dir, laid out and written
// like the project's own (internal/images), and returns their paths. root is the repository.
func BuildTestImages(root, dir string) ([]string, error) {
	in := images.Inputs{BinDir: filepath.Join(dir, "bin"), RepoDir: root, Epoch: time.Unix(0, 0)}
	if err := cnitest.GoBuild(in.BinDir, filepath.Join(root, "test/e2e/testdata/pause"), filepath.Join(root, "internal/demo")); err != nil {
		return nil, err
	}
	var archives []string
	for _, t := range []struct {
		ref string
		img images.Image
	}{
		{PauseImage, images.Image{Name: "pause", Files: []images.File{{Path: "/pause", Bin: "pause"}}, Entrypoint: []string{"/pause"}}},
		{AgentImage, images.Image{Name: "agent", Files: []images.File{{Path: "/agent", Bin: "demo"}}, Entrypoint: []string{"/agent"}}},
	} {
		layer, err := images.Layer(t.img, in)
		if err != nil {
			return nil, err
		}
		goarch, err := images.GoArch(filepath.Join(in.BinDir, t.img.Files[0].Bin))
		if err != nil {
			return nil, err
		}
		im, err := images.OCIImage(t.img, layer, goarch, nil, in)
		if err != nil {
			return nil, err
		}
		archive := filepath.Join(dir, t.img.Name+".tar")
		if err := images.WriteOCIArchive(archive, im, t.ref, in); err != nil {
			return nil, err
		}
		archives = append(archives, archive)
	}
	return archives, nil
}

// ArchiveRef returns the name containerd gives the image in an OCI archive (`make images`
// writes the build's tag into it), after checking that the archive is the multi-arch build and
// holds an image for this node's architecture, the one containerd unpacks.
func ArchiveRef(archive string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", err
	}
	defer f.Close()
	type descriptor struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Annotations map[string]string `json:"annotations"`
		Platform    *struct {
			OS           string `json:"os"`
			Architecture string `json:"architecture"`
		} `json:"platform"`
	}
	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	blobs := map[string][]byte{} // the small ones: manifests and indexes
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("%s: %w", archive, err)
		}
		if h.Name == "index.json" {
			if err := json.NewDecoder(tr).Decode(&index); err != nil {
				return "", fmt.Errorf("%s: index.json: %w", archive, err)
			}
		} else if d, ok := strings.CutPrefix(h.Name, "blobs/sha256/"); ok && h.Size < 1<<16 {
			if blobs["sha256:"+d], err = io.ReadAll(tr); err != nil {
				return "", fmt.Errorf("%s: %w", archive, err)
			}
		}
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Annotations[images.AnnotationImageName] == "" {
		return "", fmt.Errorf("%s: want one image named by %s", archive, images.AnnotationImageName)
	}
	top := index.Manifests[0]
	var platforms struct {
		Manifests []descriptor `json:"manifests"`
	}
	if err := json.Unmarshal(blobs[top.Digest], &platforms); err != nil || top.MediaType != "application/vnd.oci.image.index.v1+json" {
		return "", fmt.Errorf("%s: not the multi-arch build (an image index): %s %v", archive, top.MediaType, err)
	}
	var have []string
	for _, m := range platforms.Manifests {
		if m.Platform != nil {
			if m.Platform.OS == "linux" && m.Platform.Architecture == runtime.GOARCH {
				return top.Annotations[images.AnnotationImageName], nil
			}
			have = append(have, m.Platform.OS+"/"+m.Platform.Architecture)
		}
	}
	return "", fmt.Errorf("%s: no image for this node's linux/%s (it has %v)", archive, runtime.GOARCH, have)
}
