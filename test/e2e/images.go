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
	"slices"
	"strings"
	"time"

	"github.com/kubemesh/proxy-init/test/cnitest"
	"github.com/kubemesh/proxy-init/tools/images"
)

// The harness's own images.
const (
	// PauseImage is the sandbox image containerd runs for every pod.
	PauseImage = "e2e.test/pause:1"
	// AgentImage holds the demo helper (test/demo) as /agent: `/agent proxy` is a fake sidecar
	// proxy that answers every connection with its original destination (SO_ORIGINAL_DST),
	// `/agent serve` a plain server, `/agent dial HOST:PORT` a client that prints the reply.
	AgentImage = "e2e.test/agent:1"
	// ProxyStandIn stands in for Linkerd's proxy image (cr.l5d.io/linkerd/proxy) in the pods
	// Linkerd's injector writes: our overlay's files (images.Overlay: proxy-init and the
	// validator at Linkerd's paths) over a fake of the rest, the demo's fake proxy as
	// /usr/lib/linkerd/linkerd2-proxy (the entrypoint, with the admin port's probes) and as
	// /usr/lib/linkerd/linkerd-await.
	ProxyStandIn = "e2e.test/linkerd-proxy:stand-in"
)

// BuildTestImages builds the pause, agent and proxy stand-in images as OCI archives in dir,
// laid out and written like the project's own (tools/images), and returns their paths. root
// is the repository, whose bin/ holds `make build`'s binaries.
func BuildTestImages(root, dir string) ([]string, error) {
	in := images.Inputs{BinDir: filepath.Join(dir, "bin"), RepoDir: root, Epoch: time.Unix(0, 0)}
	if err := cnitest.GoBuild(in.BinDir, filepath.Join(root, "test/e2e/testdata/pause"), filepath.Join(root, "test/demo")); err != nil {
		return nil, err
	}
	proxyInit, err := os.ReadFile(filepath.Join(nodeBinDir(root), images.BinProxyInit))
	if err != nil {
		return nil, fmt.Errorf("%w (run `make images`)", err)
	}
	if err := os.WriteFile(filepath.Join(in.BinDir, images.BinProxyInit), proxyInit, 0o755); err != nil {
		return nil, err
	}
	standIn := images.Image{
		Name: "linkerd-proxy-stand-in",
		Files: append(slices.Clone(images.Overlay.Files),
			images.File{Path: "/usr/lib/linkerd/linkerd2-proxy", Bin: "demo"},
			images.File{Path: "/usr/lib/linkerd/linkerd-await", Link: "/usr/lib/linkerd/linkerd2-proxy"}),
		Entrypoint: []string{"/usr/lib/linkerd/linkerd2-proxy", "proxy", "-ports", "4140,4143", "-admin", "4191"},
	}
	var archives []string
	for _, t := range []struct {
		ref string
		img images.Image
	}{
		{PauseImage, images.Image{Name: "pause", Files: []images.File{{Path: "/pause", Bin: "pause"}}, Entrypoint: []string{"/pause"}}},
		{AgentImage, images.Image{Name: "agent", Files: []images.File{{Path: "/agent", Bin: "demo"}}, Entrypoint: []string{"/agent"}}},
		{ProxyStandIn, standIn},
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

// BuildNextImage builds the linkerd-cni image again, for the node's platform from the same
// binaries (`make images`'s), as ref's repository with ref's tag plus "-next": the image B a
// rolling upgrade moves to. It returns the archive and the new reference.
func BuildNextImage(root, dir, ref string) (string, string, error) {
	img, err := images.Find("linkerd-cni")
	if err != nil {
		return "", "", err
	}
	tag := ref[strings.LastIndex(ref, ":")+1:] + "-next"
	archive := filepath.Join(dir, "linkerd-cni-next.tar")
	in := images.Inputs{BinDir: filepath.Join(root, "bin"), RepoDir: root, Epoch: time.Unix(0, 0)}
	if _, err := images.BuildOCI(archive, img, tag, []string{nodePlatform}, in); err != nil {
		return "", "", err
	}
	return archive, img.Ref(tag), nil
}

// nodePlatform is the platform of the cluster's nodes (this machine's), the one of each
// multi-arch image containerd unpacks.
const nodePlatform = "linux/" + runtime.GOARCH

// nodeBinDir is where `make images` (platform-bins) put the binaries of nodePlatform.
func nodeBinDir(root string) string {
	return images.PlatformBinDir(filepath.Join(root, "bin"), nodePlatform)
}
