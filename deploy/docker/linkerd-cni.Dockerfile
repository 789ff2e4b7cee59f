# syntax=docker/dockerfile:1
# The linkerd-cni image: the CNI plugin binary, which is also the DaemonSet installer
# (`linkerd-cni install`) that copies itself onto the node. Build from the repository root:
#   docker build -f deploy/docker/linkerd-cni.Dockerfile -t ghcr.io/kubemesh/linkerd-cni:v0.1.0 .
#
# One static binary on distroless/static: no shell, no package manager. The installer runs as
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
      -o /out/linkerd-cni ./cmd/linkerd-cni

FROM gcr.io/distroless/static-debian12
# CONTAINER_CNI_BIN_DIR (default /opt/cni/bin) is where the installer copies the plugin from.
COPY --from=build /out/linkerd-cni /opt/cni/bin/linkerd-cni
USER 0:0
ENTRYPOINT ["/opt/cni/bin/linkerd-cni"]
CMD ["install"]
