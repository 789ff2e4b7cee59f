package e2e

import (
	"fmt"
	"path/filepath"

	"github.com/kubemesh/proxy-init/internal/cnitest"
)

// AgentImage holds the demo helper (internal/demo) as /agent: `/agent proxy` is a fake sidecar
// proxy that answers every connection with its original destination (SO_ORIGINAL_DST), `/agent
// serve` a plain server, `/agent dial HOST:PORT` a client that prints the reply.
const AgentImage = "e2e.test/agent:1"

// BuildTestImages builds the pause and agent images as OCI tarballs in dir and returns their
// paths. root is the repository's root.
func BuildTestImages(root, dir string) ([]string, error) {
	bin := filepath.Join(dir, "bin")
	if err := cnitest.GoBuild(bin, filepath.Join(root, "test/e2e/testdata/pause"), filepath.Join(root, "internal/demo")); err != nil {
		return nil, err
	}
	images := []testImage{
		{Ref: PauseImage, Files: []imageFile{{Path: "/pause", Src: filepath.Join(bin, "pause"), Mode: 0o755}}, Entrypoint: []string{"/pause"}},
		{Ref: AgentImage, Files: []imageFile{{Path: "/agent", Src: filepath.Join(bin, "demo"), Mode: 0o755}}, Entrypoint: []string{"/agent"}},
	}
	var tars []string
	for i, img := range images {
		tar := filepath.Join(dir, fmt.Sprintf("test-image-%d.tar", i))
		if err := writeOCITarball(tar, img); err != nil {
			return nil, err
		}
		tars = append(tars, tar)
	}
	return tars, nil
}

// Image names of the project's images, as the manifests in deploy/ name them.
const (
	LinkerdCNIImage = "ghcr.io/kubemesh/linkerd-cni:v0.1.0"
	ProxyInitImage  = "ghcr.io/kubemesh/proxy-init:v0.1.0"
)

// BuildProjectImages builds scratch images of the project's static binaries with the paths the
// Dockerfiles give them. Interim: `make images` replaces them.
func BuildProjectImages(root, dir string) ([]string, error) {
	bin := filepath.Join(dir, "bin")
	if err := cnitest.GoBuild(bin, filepath.Join(root, "cmd/proxy-init"), filepath.Join(root, "cmd/linkerd-cni")); err != nil {
		return nil, err
	}
	if err := cnitest.GoBuild(filepath.Join(bin, "plugin"), "-tags=pluginonly", filepath.Join(root, "cmd/linkerd-cni")); err != nil {
		return nil, err
	}
	images := []testImage{
		{Ref: LinkerdCNIImage, Entrypoint: []string{"/usr/local/bin/linkerd-cni"}, Files: []imageFile{
			{Path: "/usr/local/bin/linkerd-cni", Src: filepath.Join(bin, "linkerd-cni"), Mode: 0o755},
			{Path: "/opt/cni/bin/linkerd-cni", Src: filepath.Join(bin, "plugin", "linkerd-cni"), Mode: 0o755},
		}},
		{Ref: ProxyInitImage, Entrypoint: []string{"/usr/local/bin/proxy-init"}, Files: []imageFile{
			{Path: "/usr/local/bin/proxy-init", Src: filepath.Join(bin, "proxy-init"), Mode: 0o755},
			{Path: "/usr/local/bin/linkerd-network-validator", Src: filepath.Join(bin, "proxy-init"), Mode: 0o755},
		}},
	}
	var tars []string
	for i, img := range images {
		tar := filepath.Join(dir, fmt.Sprintf("project-image-%d.tar", i))
		if err := writeOCITarball(tar, img); err != nil {
			return nil, err
		}
		tars = append(tars, tar)
	}
	return tars, nil
}
