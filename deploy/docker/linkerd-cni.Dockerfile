# syntax=docker/dockerfile:1
# Generated from tools/images (layout.go) by `make dockerfiles`: edit that, not this file.
#
# The linkerd-cni image: the DaemonSet's binary (install, agent, repair) and what the installer
# copies onto the node: the plugin-only build. Linkerd's paths are links to the DaemonSet's binary:
# Linkerd's linkerd2-cni chart runs the repair controller as
# /usr/lib/linkerd/linkerd-cni-repair-controller, and its image's CMD is
# /usr/bin/linkerd2-cni-install. The installer runs as root (the node's CNI directories are
# root-owned) with no capability; the node agent as root, with NET_ADMIN and SYS_ADMIN for its
# audits (it heals rules inside pods' namespaces), SYS_PTRACE only with its PID fallback, and no
# capability for lookups alone; the repair controller as 65534.
#
# Build from the repository root with BuildKit (Docker 23 or later, which keeps file
# capabilities on COPY):
#   docker build -f deploy/docker/linkerd-cni.Dockerfile -t ghcr.io/kubemesh/linkerd-cni:v0.1.0 .
# `make images` builds the same image without a daemon: bin/images/linkerd-cni.tar.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
COPY tools/go.mod tools/go.sum ./tools/
RUN go mod download && go -C tools mod download
COPY . .
ARG VERSION=dev
ARG SOURCE_DATE_EPOCH=0
RUN make build tools-bin VERSION="$VERSION" && \
    bin/tools/images rootfs --image linkerd-cni --bin bin --out /rootfs --epoch "$SOURCE_DATE_EPOCH"

FROM scratch
COPY --from=build /rootfs/ /
USER 0:0
ENTRYPOINT ["/usr/local/bin/linkerd-cni"]
CMD ["install"]
