# proxy-init and linkerd-cni. Run as root on Debian: `make demo`, `make test`, `make bench`, `make e2e`.
SHELL := /bin/bash
GO ?= go
# The toolchain every target builds and tests with is go.mod's toolchain line (a patched Go; see
# docs/security.md). A machine whose Go is older fetches it from the module proxy once; exporting
# it here also overrides a GOTOOLCHAIN=local in the machine's go env.
export GOTOOLCHAIN := $(shell sed -n 's/^toolchain //p' go.mod)
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X github.com/kubemesh/proxy-init/internal/buildinfo.Version=$(VERSION)
BIN := bin
# Packages the tests and the demo need from Debian (strace: a test traces proxy-init to show
# that the nft mode executes no program, another stands in for a kernel without legacy iptables;
# qemu-user-static: the arm64 binaries run under qemu-aarch64-static in internal/hygiene).
APT_PACKAGES := iptables nftables iproute2 libcap2-bin strace qemu-user-static
# Packages the end-to-end cluster needs besides those: Debian's containerd 1.6 and runc (the second
# runtime, E2E_RUNTIME=containerd1), and what runc's seccomp support builds against (make
# e2e-runtime).
E2E_APT_PACKAGES := containerd runc libseccomp-dev pkg-config gcc libc6-dev

.PHONY: all build platform-bins tools-bin images overlay chart release dockerfiles manifests deps e2e-deps e2e-runtime kube-bins kube-node test e2e e2e-bench e2e-ci unit race vet lint fmt-check tidy-check deadcode vulncheck demo bench stress fuzz clean

all: build

# bin/linkerd-cni runs the DaemonSet (install, agent, repair); bin/plugin/ holds what the
# installer copies onto each node: linkerd-cni, the lean plugin-only build without the
# DaemonSet's subcommands (see cmd/linkerd-cni). These two lines are the one place the
# binaries' build flags live: platform-bins, the images, the release and the image tests all build
# through them (GOOS and GOARCH come from the environment).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/proxy-init ./cmd/linkerd-cni
	CGO_ENABLED=0 $(GO) build -trimpath -tags pluginonly -ldflags '$(LDFLAGS)' -o $(BIN)/plugin/ ./cmd/linkerd-cni

# platform-bins cross-compiles `build` for every platform of the images, into bin/linux-amd64/,
# bin/linux-arm64/ (tools/images.PlatformBinDir). Go's build cache makes a second run cheap.
PLATFORMS ?= linux/amd64 linux/arm64
platform-bins:
	@set -e; for p in $(PLATFORMS); do \
		GOOS=$${p%/*} GOARCH=$${p#*/} $(MAKE) --no-print-directory build VERSION='$(VERSION)' BIN='$(BIN)/'$${p/\//-}; \
	done

# The release tooling (images, overlay, chart, release, dockerfiles, manifests) is its own Go
# module, tools/, so that what it links (Helm's registry client, go-containerregistry, sigstore,
# SPDX) stays out of the product's go.mod. tools-bin builds its commands into TOOLS_BIN; the
# targets below run them from the repository root, whose paths they take.
TOOLS_BIN := $(CURDIR)/bin/tools
tools-bin:
	$(GO) -C tools build -o $(TOOLS_BIN)/ ./cmd/images ./cmd/manifests

# images writes the images as OCI image archives, without a container daemon, one per image,
# each an index of every platform in PLATFORMS:
#   bin/images/linkerd-cni.tar          ghcr.io/kubemesh/linkerd-cni:$(IMAGE_TAG)
#   bin/images/proxy-init.tar           ghcr.io/kubemesh/proxy-init:$(IMAGE_TAG)
#   bin/images/proxy-init-nftables.tar  ghcr.io/kubemesh/proxy-init:$(IMAGE_TAG)-nftables
# Load one with `ctr -n k8s.io images import bin/images/proxy-init.tar` (the name comes from the
# archive; containerd unpacks its own platform) or `docker load -i`. The layouts live in
# tools/images/layout.go; the Debian packages of the proxy-init image are fetched for each
# architecture by a private apt directory under DEB_CACHE, which keeps them for the next build.
# Files are stamped with the last commit's time, so the same commit gives the same images.
IMAGE_TAG ?= $(VERSION)
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
DEB_CACHE ?= /var/cache/proxy-init-images/debian
IMAGE_FLAGS = --bin $(BIN) --platforms '$(PLATFORMS)' --deb-cache $(DEB_CACHE) --epoch $(SOURCE_DATE_EPOCH)
images: platform-bins tools-bin
	$(TOOLS_BIN)/images build $(IMAGE_FLAGS) --out $(BIN)/images --tag $(IMAGE_TAG)

# overlay puts our proxy-init and validator over Linkerd's proxy image, every platform of it,
# without a container daemon, and pushes the result (docs/images.md#the-proxy-overlay):
#   make overlay LINKERD_PROXY=cr.l5d.io/linkerd/proxy:edge-26.1.1 OVERLAY=registry.example/linkerd/proxy:edge-26.1.1
# LINKERD_PROXY may also be an OCI layout directory or archive. SIGNING_KEY signs the result.
LINKERD_PROXY ?=
OVERLAY ?=
SIGNING_KEY ?=
overlay: platform-bins tools-bin
	$(TOOLS_BIN)/images overlay --bin $(BIN) --platforms '$(PLATFORMS)' --epoch $(SOURCE_DATE_EPOCH) \
		--version '$(VERSION)' --base '$(LINKERD_PROXY)' --to '$(OVERLAY)' --key '$(SIGNING_KEY)'

# chart packages the linkerd2-cni chart as version VERSION into bin/chart (and pushes it to
# oci://REGISTRY given one).
REGISTRY ?=
chart: tools-bin
	$(TOOLS_BIN)/images chart --version '$(VERSION)' --out $(BIN)/chart --registry '$(REGISTRY)' --epoch $(SOURCE_DATE_EPOCH)

# release builds everything a release ships into bin/release (docs/images.md#make-release):
# the binaries of every platform (bin/release/bin), the images' archives and SBOMs
# (bin/release/images), the chart package, images.txt (each image's digest) and SHA256SUMS.
# REGISTRY=host[:port]/namespace pushes the images (with their SBOMs as referrers) and the chart
# there; SIGNING_KEY (and COSIGN_PASSWORD) signs every image, SBOM and chart digest.
#   make release VERSION=v0.2.0 REGISTRY=ghcr.io/kubemesh SIGNING_KEY=cosign.key
RELEASE_DIR := $(BIN)/release
release:
	@case '$(VERSION)' in v[0-9]*) ;; *) echo "make release needs VERSION=vX.Y.Z (got $(VERSION))"; exit 1;; esac
	$(MAKE) --no-print-directory tools-bin
	$(MAKE) --no-print-directory platform-bins BIN=$(RELEASE_DIR)/bin VERSION='$(VERSION)'
	$(TOOLS_BIN)/images release --bin $(RELEASE_DIR)/bin --platforms '$(PLATFORMS)' --deb-cache $(DEB_CACHE) \
		--epoch $(SOURCE_DATE_EPOCH) --out $(RELEASE_DIR) --version '$(VERSION)' --registry '$(REGISTRY)' --key '$(SIGNING_KEY)'

# dockerfiles regenerates deploy/docker/*.Dockerfile from the same layouts (a test fails when
# they are stale).
dockerfiles: tools-bin
	$(TOOLS_BIN)/images dockerfiles --out deploy/docker

# manifests regenerates deploy/linkerd-cni from the linkerd2-cni chart's default rendering
# (deploy/charts/linkerd2-cni; a test fails when they are stale).
manifests: tools-bin
	$(TOOLS_BIN)/manifests

# deps installs the host tools the root tests and the demo drive, only when one is missing.
deps:
	@missing=""; \
	for c in iptables-legacy-restore iptables-nft-restore nft ip setcap strace qemu-aarch64-static; do \
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

# kube-node builds kube-controller-manager, kube-scheduler and kubelet as one binary for the
# end-to-end node, cached like kube-bins (see test/e2e/kube/build.sh).
kube-node:
	test/e2e/kube/build.sh

# e2e-runtime builds containerd v2 (with its shim and ctr) and runc v1.5 from Go modules into a
# cache outside the checkout, like kube-node (see test/e2e/runtime/build.sh; about 4 minutes).
e2e-runtime: e2e-deps
	test/e2e/runtime/build.sh

# e2e-deps installs the Debian packages of E2E_APT_PACKAGES, only when one is missing.
e2e-deps: deps
	@if ! command -v containerd >/dev/null || ! command -v runc >/dev/null || \
		! pkg-config --exists libseccomp 2>/dev/null || ! command -v gcc >/dev/null; then \
		echo "installing $(E2E_APT_PACKAGES) with apt-get"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(E2E_APT_PACKAGES); \
	fi

# vet checks both builds of linkerd-cni: the full one and the node's -tags pluginonly copy, the
# release tooling (tools/), and the end-to-end tests (-tags e2e, and e2ebench for make
# e2e-bench; test/e2e is a module of its own, since it builds images with tools/).
vet:
	$(GO) vet ./...
	$(GO) vet -tags pluginonly ./cmd/linkerd-cni/
	$(GO) -C tools vet ./...
	$(GO) -C test/e2e vet -tags e2e,e2ebench ./...

# lint runs staticcheck (honnef.co/go/tools, pinned as a tool in go.mod like deadcode, so every
# machine runs the same checks) with its default checks, over the builds vet checks: ./..., the
# node's -tags pluginonly plugin, the release tooling and the end-to-end tests. It fails on any finding; its cache
# (~/.cache/staticcheck) makes a second run on an unchanged tree take seconds.
# The release tooling (tools/) and the end-to-end suite (test/e2e) are modules of their own, run
# with the same binary.
lint:
	$(GO) tool staticcheck ./...
	$(GO) tool staticcheck -tags pluginonly ./cmd/linkerd-cni/
	@sc=$$($(GO) tool -n staticcheck) && set -x && cd tools && $$sc ./... && cd ../test/e2e && $$sc -tags e2e,e2ebench ./...

# tidy-check covers the product's module and the two that require it through a replace: the
# release tooling (tools/) and the end-to-end suite (test/e2e).
tidy-check:
	@for m in . tools test/e2e; do \
		$(GO) -C $$m mod tidy -diff || { echo "$$m/go.mod, go.sum are not tidy: run go mod tidy in $$m"; exit 1; }; \
	done

# deadcode fails on any function that no program reaches (golang.org/x/tools' deadcode, pinned
# in go.mod, run without -test: code only tests reach counts as dead), in the product and in the
# release tooling (tools/, whose programs are its commands), except under the test helpers
# hack/deadcode-allow.txt names with the reason.
DEADCODE_ALLOW := hack/deadcode-allow.txt
deadcode:
	@dc=$$($(GO) tool -n deadcode) && \
	dead=$$({ $$dc ./... && (cd tools && $$dc ./...) | sed 's|^|tools/|'; } | grep -v -F -f <(sed -e 's/[[:space:]]*#.*//' -e '/^$$/d' $(DEADCODE_ALLOW))); \
	if [ -n "$$dead" ]; then \
		echo "unreachable from every program: move it into a test or a test-helper package, or list it in $(DEADCODE_ALLOW) with the reason:"; \
		echo "$$dead"; exit 1; \
	fi

# vulncheck fails when the code calls a symbol with a known vulnerability, in a module or in the
# standard library of the toolchain above (golang.org/x/vuln's govulncheck, on ./... and on the
# node's -tags pluginonly build). The database is an offline one, built from the golang.org/x/vulndb
# module at VULNDB_VERSION into VULNDB_CACHE (/var/cache/proxy-init-vulndb/<version>) once and
# reused: the online database is never asked, so the result moves only with this pin (move it
# to a newer vulndb pseudo-version to take new advisories). Both tools run by `go run
# module@version` (hack/vulncheck.sh), not from go.mod: release tooling stays out of the product's
# module. The first run takes about 2.5 minutes (downloads, the database), later ones about 20 s.
GOVULNCHECK_VERSION := v1.9.0
VULNDB_VERSION := v0.0.0-20261105234957-e22db6528018
VULNDB_CACHE ?= /var/cache/proxy-init-vulndb
vulncheck:
	GOVULNCHECK_VERSION=$(GOVULNCHECK_VERSION) VULNDB_VERSION=$(VULNDB_VERSION) VULNDB_CACHE=$(VULNDB_CACHE) hack/vulncheck.sh

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# test runs every test, the root network-namespace ones included (the product's module, then the
# release tooling's in tools/), then the stress workloads
# with small counts (they print their figures). -p 1 keeps the root integration suites
# (namespaces, a kube-apiserver) from starving each other on small machines.
test: export PATH := $(PATH):/usr/sbin:/sbin
test: deps kube-bins fmt-check vet lint tidy-check deadcode vulncheck race
	$(GO) test -count=1 -p 1 -timeout 40m $$($(GO) list ./... | grep -v /internal/stress)
	$(GO) -C tools test -count=1 -p 1 -timeout 40m ./...
	$(MAKE) --no-print-directory stress STRESS_FLAGS=

# e2e runs the end-to-end suite on a two-node dual-stack cluster (containerd, runc, kubelet per
# node) in namespaces of its own; see docs/e2e.md. One scenario: make e2e E2E_RUN=TestE2E/MeshedPod
# On Debian's containerd 1.6 instead of containerd 2: make e2e E2E_RUNTIME=containerd1
# test/e2e is a module of its own (it builds images with tools/images), so the suite runs in its
# directory. e2e-ci is what .ci/run runs: every scenario on containerd 2, then
# E2E_CONTAINERD1_RUN on containerd 1.6.
E2E_RUN ?= .
E2E_RUNTIME ?= containerd2
E2E_CONTAINERD1_RUN ?= TestE2E/(DaemonSet|MeshedPod|AgentHealsInPlace|Teardown|APIUnreachable|NothingLeftOnHost)
e2e: export PATH := $(PATH):/usr/sbin:/sbin
e2e: export E2E_RUNTIME := $(E2E_RUNTIME)
e2e: e2e-deps e2e-runtime kube-bins kube-node images
	$(GO) -C test/e2e test -tags e2e -count=1 -p 1 -timeout 60m -v -run '$(E2E_RUN)' .

# e2e-bench fills one node to the kubelet's 110 pods, with and without the plugin, and prints
# the figures docs/performance.md quotes (about 10 minutes; not part of make test or CI).
e2e-bench: export PATH := $(PATH):/usr/sbin:/sbin
e2e-bench: export E2E_RUNTIME := $(E2E_RUNTIME)
e2e-bench: e2e-deps e2e-runtime kube-bins kube-node images
	$(GO) -C test/e2e test -tags e2e,e2ebench -count=1 -p 1 -timeout 60m -v -run '^TestE2EBench$$' .

e2e-ci:
	$(MAKE) --no-print-directory e2e
	$(MAKE) --no-print-directory e2e E2E_RUNTIME=containerd1 E2E_RUN='$(E2E_CONTAINERD1_RUN)'

# race runs the unit tests (-short: no kube-apiserver) of the packages that run goroutines under
# the race detector: the node agent (informers, the socket server, audit workers), the installer
# (watches, the admin server), the repair controller, the plugin's agent client and the wire
# protocol, the Runner (its locks and fallbacks) and the validator (its listener and dialer). make
# test runs it before the other tests.
RACE_PKGS := ./cniplugin/agent/ ./cniplugin/install/ ./cniplugin/repair/ ./cniplugin/wire/ ./cniplugin/ ./iptables/runner/ ./validator/
race: export PATH := $(PATH):/usr/sbin:/sbin
race:
	$(GO) test -race -short -count=1 $(RACE_PKGS)

# unit runs every test that needs neither root nor a kube-apiserver (-short), the product's and
# the release tooling's; it passes as any user.
unit:
	$(GO) test -count=1 -short ./...
	$(GO) -C tools test -count=1 -short ./...

# stress runs the adversarial workloads (concurrent writers, applies racing cleanups, kill -9
# during apply, installer churn) in throwaway namespaces and prints what they saw; any corrupt
# end state fails it. STRESS_FLAGS sets the counts; make test runs it with the small defaults.
STRESS_FLAGS ?= -stress.procs 30 -stress.kills 200 -stress.churn 40
stress: export PATH := $(PATH):/usr/sbin:/sbin
stress: deps
	@set -o pipefail; $(GO) test -count=1 -v -timeout 60m -run Stress ./internal/stress/ $(STRESS_FLAGS) \
		| grep -E --line-buffered '^(stress:|--- FAIL|FAIL|ok|panic|\s+\S+_test\.go:)'

demo: export PATH := $(PATH):/usr/sbin:/sbin
demo: deps
	./hack/demo.sh

bench: export PATH := $(PATH):/usr/sbin:/sbin
bench: deps kube-bins
	$(GO) test -count=1 -run '^$$' -bench . -benchtime 1x ./internal/bench/ ./cniplugin/...

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParsePorts -fuzztime 30s ./iptables/
	$(GO) test -run '^$$' -fuzz FuzzParseCIDR -fuzztime 30s ./iptables/
	$(GO) test -run '^$$' -fuzz FuzzParseConfig -fuzztime 30s ./cniplugin/
	$(GO) test -run '^$$' -fuzz FuzzMerge -fuzztime 30s ./cniplugin/
	$(GO) test -run '^$$' -fuzz FuzzDecodeKubeletPod -fuzztime 30s ./cniplugin/
	$(GO) test -run '^$$' -fuzz FuzzJSONSpans -fuzztime 30s ./cniplugin/install/

clean:
	rm -rf $(BIN)
