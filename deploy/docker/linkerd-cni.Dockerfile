# syntax=docker/dockerfile:1
# The linkerd-cni image: the DaemonSet's binary (`linkerd-cni install`, `linkerd-cni repair`) in
# /usr/local/bin, and the plugin-only build (-tags pluginonly) in /opt/cni/bin, which the installer
# copies onto the node. The plugin starts once per pod on the pod's critical path, so it leaves
# out the installer's and repair controller's dependencies. Build from the repository root:
#   docker build -f deploy/docker/linkerd-cni.Dockerfile -t ghcr.io/kubemesh/linkerd-cni:v0.1.0 .
#
# Static binaries on distroless/static: no shell, no package manager. The installer runs as
# root because the node's CNI directories are root-owned, but holds no capability at all
# (drop: ALL in the DaemonSet): ownership of the directories is all it needs. The same image runs
# the repair controller (`linkerd-cni repair`), which the DaemonSet runs as user 65534. The plugin
# itself runs on the node, started by the container runtime, not in this image.

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
      -ldflags "-s -w -X github.com/kubemesh/proxy-init/internal/buildinfo.Version=${VERSION}" \
      -o /out/full/linkerd-cni ./cmd/linkerd-cni && \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -tags pluginonly \
      -ldflags "-s -w -X github.com/kubemesh/proxy-init/internal/buildinfo.Version=${VERSION}" \
      -o /out/plugin/linkerd-cni ./cmd/linkerd-cni

FROM gcr.io/distroless/static-debian12
# CONTAINER_CNI_BIN_DIR (default /opt/cni/bin) is where the installer copies the plugin from.
COPY --from=build /out/plugin/linkerd-cni /opt/cni/bin/linkerd-cni
COPY --from=build /out/full/linkerd-cni /usr/local/bin/linkerd-cni
USER 0:0
ENTRYPOINT ["/usr/local/bin/linkerd-cni"]
CMD ["install"]
