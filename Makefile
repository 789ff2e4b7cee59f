# proxy-init and linkerd-cni. Run as root on Debian: `make demo`, `make test`, `make bench`.
SHELL := /bin/bash
GO ?= go
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/kubemesh/proxy-init/internal/buildinfo.Version=$(VERSION)
BIN := bin
# Packages the tests and the demo need from Debian (strace: a test traces proxy-init to show
# that the nft mode executes no program).
APT_PACKAGES := iptables nftables iproute2 strace

.PHONY: all build deps kube-bins test unit vet fmt-check demo bench fuzz clean

all: build

# bin/linkerd-cni runs the DaemonSet (install, repair); bin/plugin/linkerd-cni is the lean
# plugin-only build that the installer copies onto each node (see cmd/linkerd-cni).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/proxy-init ./cmd/linkerd-cni
	CGO_ENABLED=0 $(GO) build -trimpath -tags pluginonly -ldflags '$(LDFLAGS)' -o $(BIN)/plugin/linkerd-cni ./cmd/linkerd-cni

# deps installs the host tools the root tests and the demo drive, only when one is missing.
deps:
	@missing=""; \
	for c in iptables-legacy-restore iptables-nft-restore nft ip strace; do \
		PATH=$$PATH:/usr/sbin:/sbin command -v $$c >/dev/null || missing=1; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing $(APT_PACKAGES) with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(APT_PACKAGES); \
	fi

# kube-bins builds kube-apiserver and etcd from Go modules into a cache outside the checkout
# (about 11 minutes the first time, nothing afterwards).
kube-bins:
	test/kube/build.sh

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# test runs every test, the root network-namespace ones included. -p 1 keeps the root
# integration suites (namespaces, a kube-apiserver) from starving each other on small machines.
test: export PATH := $(PATH):/usr/sbin:/sbin
test: deps kube-bins fmt-check vet
	$(GO) test -count=1 -p 1 -timeout 40m ./...

# unit runs the tests that need neither root nor the kube binaries' build time.
unit:
	$(GO) test -count=1 -short ./iptables/ ./proxyinit/ ./cniplugin/

demo: export PATH := $(PATH):/usr/sbin:/sbin
demo: deps
	./hack/demo.sh

bench: export PATH := $(PATH):/usr/sbin:/sbin
bench: deps kube-bins
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x ./internal/bench/ ./cniplugin/...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParsePorts -fuzztime 30s ./iptables/
	$(GO) test -run '^$$' -fuzz FuzzParseCIDR -fuzztime 30s ./iptables/

clean:
	rm -rf $(BIN)
