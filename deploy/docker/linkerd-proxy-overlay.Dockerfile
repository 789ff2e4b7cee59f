# syntax=docker/dockerfile:1
# Generated from tools/images (layout.go) by `make dockerfiles`: edit that, not this file.
#
# Linkerd's proxy image with proxy-init and the network validator replaced by ours: a Linkerd 2.20
# user changes only proxy.image.name (and version) in the linkerd-control-plane chart.
#
# Build from the repository root with BuildKit (Docker 23 or later, which keeps file
# capabilities on COPY):
#   docker build -f deploy/docker/linkerd-proxy-overlay.Dockerfile \
#     --build-arg LINKERD_PROXY_IMAGE=cr.l5d.io/linkerd/proxy --build-arg LINKERD_PROXY_VERSION=<Linkerd's version> \
#     -t <registry>/proxy:<Linkerd's version>-kubemesh .

ARG LINKERD_PROXY_IMAGE=cr.l5d.io/linkerd/proxy
ARG LINKERD_PROXY_VERSION

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY tools/go.mod tools/go.sum ./tools/
RUN go mod download && go -C tools mod download
COPY . .
ARG VERSION=dev
ARG SOURCE_DATE_EPOCH=0
RUN make build tools-bin VERSION="$VERSION" && \
    bin/tools/images rootfs --image linkerd-proxy-overlay --bin bin --out /rootfs --epoch "$SOURCE_DATE_EPOCH"

FROM ${LINKERD_PROXY_IMAGE}:${LINKERD_PROXY_VERSION}
COPY --from=build /rootfs/usr/lib/linkerd/linkerd2-proxy-init /usr/lib/linkerd/linkerd2-proxy-init
COPY --from=build /rootfs/usr/lib/linkerd/linkerd2-network-validator /usr/lib/linkerd/linkerd2-network-validator
