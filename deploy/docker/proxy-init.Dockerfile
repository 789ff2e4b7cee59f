# syntax=docker/dockerfile:1
# The proxy-init image: build from the repository root with
#   docker build -f deploy/docker/proxy-init.Dockerfile -t ghcr.io/kubemesh/proxy-init:v0.1.0 .
#   docker build -f deploy/docker/proxy-init.Dockerfile --target nftables -t ...:v0.1.0-nftables .
#
# Targets:
#   runtime (default)  Alpine with iptables-legacy and iptables-nft, for --iptables-mode legacy,
#                      nft, plain and auto. Runs as nobody (65534): proxy-init and the xtables
#                      binaries carry file capabilities cap_net_admin,cap_net_raw+ep, so with the
#                      pod granting NET_ADMIN and NET_RAW they work without root (see
#                      deploy/examples/proxy-init-workload.yaml).
#   nftables           distroless/static and nothing else: --iptables-mode=nftables programs
#                      nftables over netlink from the Go binary and needs no iptables binary.
#                      Image layers cannot reliably carry file capabilities without a shell to
#                      run setcap, so this one runs as root (runAsUser: 0) holding only NET_ADMIN
#                      and NET_RAW.
# Both also hold /usr/local/bin/linkerd-network-validator: the same binary without file
# capabilities, for `validate` in pods that drop every capability (a binary with file
# capabilities the bounding set lacks cannot even be executed).

FROM --platform=$BUILDPLATFORM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
ARG VERSION=dev
# Static: no libc, so it runs on any base, scratch included.
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath \
      -ldflags "-s -w -X github.com/kubemesh/proxy-init/internal/buildinfo.Version=${VERSION}" \
      -o /out/proxy-init ./cmd/proxy-init

FROM gcr.io/distroless/static-debian12 AS nftables
COPY --from=build /out/proxy-init /usr/local/bin/proxy-init
COPY --from=build /out/proxy-init /usr/local/bin/linkerd-network-validator
USER 0:0
ENTRYPOINT ["/usr/local/bin/proxy-init"]

FROM alpine:3.22 AS runtime
# iptables brings iptables-nft (xtables-nft-multi), iptables-legacy the legacy backend; setcap is
# only needed while building and is removed again.
RUN apk add --no-cache iptables ip6tables iptables-legacy && \
    apk add --no-cache --virtual .setcap libcap-utils && \
    touch /run/xtables.lock && chmod 0666 /run/xtables.lock
COPY --from=build /out/proxy-init /usr/local/bin/proxy-init
COPY --from=build /out/proxy-init /usr/local/bin/linkerd-network-validator
RUN setcap cap_net_admin,cap_net_raw+ep /usr/local/bin/proxy-init && \
    for b in xtables-nft-multi xtables-legacy-multi; do \
      setcap cap_net_admin,cap_net_raw+ep "$(readlink -f "$(command -v "$b")")"; \
    done && \
    apk del .setcap
USER 65534:65534
ENTRYPOINT ["/usr/local/bin/proxy-init"]
