package images

import (
	"encoding/json"
	"fmt"
	"strings"
)

// GoImage is the build stage's base: Go, make, and Debian's apt-get and dpkg-deb for the
// images with Debian packages.
const GoImage = "golang:1.26-bookworm"

// Dockerfile renders img's Dockerfile. The build stage runs `make build` and then this package
// (tools/cmd/images rootfs, which `make tools-bin` builds) to lay out the file system exactly as
// `make images` does; the final stage copies it into scratch (or over Linkerd's proxy image, for
// the overlay) with the image's configuration. BuildKit (Docker 23 or later) keeps the
// security.capability xattr on COPY.
func Dockerfile(img Image) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format+"\n", a...) }
	p("# syntax=docker/dockerfile:1")
	p("# Generated from tools/images (layout.go) by `make dockerfiles`: edit that, not this file.")
	p("#")
	for _, l := range strings.Split(img.About, "\n") {
		p("# %s", l)
	}
	p("#")
	p("# Build from the repository root with BuildKit (Docker 23 or later, which keeps file")
	p("# capabilities on COPY):")
	if img.OverBase {
		p("#   docker build -f deploy/docker/%s.Dockerfile \\", img.Name)
		p("#     --build-arg LINKERD_PROXY_IMAGE=cr.l5d.io/linkerd/proxy --build-arg LINKERD_PROXY_VERSION=<Linkerd's version> \\")
		p("#     -t <registry>/proxy:<Linkerd's version>-kubemesh .")
	} else {
		p("#   docker build -f deploy/docker/%s.Dockerfile -t %s .", img.Name, img.Ref("v0.1.0"))
		p("# `make images` builds the same image without a daemon: bin/images/%s.tar.", img.Name)
	}
	p("")
	if img.OverBase {
		p("ARG LINKERD_PROXY_IMAGE=cr.l5d.io/linkerd/proxy")
		p("ARG LINKERD_PROXY_VERSION")
		p("")
	}
	p("FROM %s AS build", GoImage)
	p("WORKDIR /src")
	p("COPY go.mod go.sum ./")
	p("COPY tools/go.mod tools/go.sum ./tools/")
	p("RUN go mod download && go -C tools mod download")
	p("COPY . .")
	p("ARG VERSION=dev")
	p("ARG SOURCE_DATE_EPOCH=0")
	p("RUN make build tools-bin VERSION=\"$VERSION\" && \\")
	p("    bin/tools/images rootfs --image %s --bin bin --out /rootfs --epoch \"$SOURCE_DATE_EPOCH\"", img.Name)
	p("")
	if img.OverBase {
		p("FROM ${LINKERD_PROXY_IMAGE}:${LINKERD_PROXY_VERSION}")
		for _, f := range img.Files {
			p("COPY --from=build /rootfs%s %s", f.Path, f.Path)
		}
		return b.String()
	}
	p("FROM scratch")
	p("COPY --from=build /rootfs/ /")
	p("USER %s", img.User)
	if len(img.Entrypoint) > 0 {
		p("ENTRYPOINT %s", jsonArray(img.Entrypoint))
	}
	if len(img.Cmd) > 0 {
		p("CMD %s", jsonArray(img.Cmd))
	}
	return b.String()
}

func jsonArray(s []string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
