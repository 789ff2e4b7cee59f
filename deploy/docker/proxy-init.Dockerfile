# syntax=docker/dockerfile:1
# Generated from tools/images (layout.go) by `make dockerfiles`: edit that, not this file.
#
# The proxy-init image, for every --iptables-mode: iptables-legacy and iptables-nft from Debian's
# packages, with the same file capabilities as proxy-init, so that it runs as nobody (65534)
# holding only what the pod grants (NET_ADMIN, NET_RAW). Linkerd's paths are links to it.
#
# Build from the repository root with BuildKit (Docker 23 or later, which keeps file
# capabilities on COPY):
#   docker build -f deploy/docker/proxy-init.Dockerfile -t ghcr.io/kubemesh/proxy-init:v0.1.0 .
# `make images` builds the same image without a daemon: bin/images/proxy-init.tar.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY tools/go.mod tools/go.sum ./tools/
RUN go mod download && go -C tools mod download
COPY . .
ARG VERSION=dev
ARG SOURCE_DATE_EPOCH=0
RUN make build tools-bin VERSION="$VERSION" && \
    bin/tools/images rootfs --image proxy-init --bin bin --out /rootfs --epoch "$SOURCE_DATE_EPOCH"

FROM scratch
COPY --from=build /rootfs/ /
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/proxy-init"]
