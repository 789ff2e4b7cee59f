# syntax=docker/dockerfile:1
# Generated from tools/images (layout.go) by `make dockerfiles`: edit that, not this file.
#
# The small proxy-init image: the static binary and nothing else, for --iptables-mode nftables and
# auto (which writes iptables-nft's rules over netlink when no iptables binary is present). It
# runs as nobody with the same file capabilities as the full image.
#
# Build from the repository root with BuildKit (Docker 23 or later, which keeps file
# capabilities on COPY):
#   docker build -f deploy/docker/proxy-init-nftables.Dockerfile -t ghcr.io/kubemesh/proxy-init:v0.1.0-nftables .
# `make images` builds the same image without a daemon: bin/images/proxy-init-nftables.tar.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY tools/go.mod tools/go.sum ./tools/
RUN go mod download && go -C tools mod download
COPY . .
ARG VERSION=dev
ARG SOURCE_DATE_EPOCH=0
RUN make build tools-bin VERSION="$VERSION" && \
    bin/tools/images rootfs --image proxy-init-nftables --bin bin --out /rootfs --epoch "$SOURCE_DATE_EPOCH"

FROM scratch
COPY --from=build /rootfs/ /
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/proxy-init"]
