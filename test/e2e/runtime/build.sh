#!/usr/bin/env bash
# Builds the end-to-end node's container runtime from Go modules: containerd, its runc shim and
# ctr (containerd v2), and runc (with seccomp, through cgo and Debian's libseccomp-dev), into a
# cache outside the repository so fresh clones on the same machine (CI) reuse them. Debian 12's
# containerd 1.6 and runc 1.1 stay the second runtime (E2E_RUNTIME=containerd1, docs/e2e.md).
#
# Usage: test/e2e/runtime/build.sh [--check] [--print-dir]
#   (no flag)    build if the cache is missing or stale, else do nothing
#   --check      exit 0 if the cache is up to date, 1 if not; build nothing
#   --print-dir  print the cache directory and exit
#
# Cache directory: $E2E_RUNTIME_CACHE, default /var/cache/proxy-init-runtime. Staleness: a
# SHA-256 over this script (which names the versions) and `go version`, kept in $dir/.stamp. The
# modules' own go.sum pins every dependency. Concurrent runs are serialised with flock; each
# binary is installed by rename, then the stamp.
set -euo pipefail

containerd_version=v2.4.2
runc_version=v1.5.3

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${E2E_RUNTIME_CACHE:-/var/cache/proxy-init-runtime}"
bins=(containerd containerd-shim-runc-v2 ctr runc)

case "${1:-}" in
"" | --check) ;;
--print-dir)
	echo "$dir"
	exit 0
	;;
*)
	echo "usage: $0 [--check|--print-dir]" >&2
	exit 2
	;;
esac

want="$({ sha256sum "$here/build.sh" | cut -d' ' -f1; go version; } | sha256sum | cut -d' ' -f1)"
up_to_date() {
	[[ "$(cat "$dir/.stamp" 2>/dev/null)" == "$want" ]] || return 1
	local b
	for b in "${bins[@]}"; do [[ -x "$dir/$b" ]] || return 1; done
}

if [[ ${1:-} == --check ]]; then
	up_to_date && { echo "containerd $containerd_version and runc $runc_version up to date in $dir"; exit 0; }
	echo "containerd $containerd_version and runc $runc_version missing or stale in $dir (run: make e2e-runtime)"
	exit 1
fi

if ! pkg-config --exists libseccomp 2>/dev/null; then
	echo "runc needs libseccomp's headers: apt-get install libseccomp-dev pkg-config (make e2e-deps)" >&2
	exit 1
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock -n 9 || { echo "waiting for another build of the runtime in $dir"; flock 9; }
if up_to_date; then
	echo "containerd $containerd_version and runc $runc_version up to date in $dir (stamp ${want:0:12}); nothing to build"
	exit 0
fi

tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
start=$SECONDS
echo "building containerd $containerd_version and runc $runc_version into $dir ..."
# As containerd's own Makefile builds them, without cgo: the snapshotters that need it (btrfs)
# are not used here, and the shim is static like a release's.
pkg=github.com/containerd/containerd/v2
GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -tags urfave_cli_no_docs \
	-ldflags "-s -w -X $pkg/version.Version=$containerd_version -X $pkg/version.Revision=module" \
	"$pkg/cmd/containerd@$containerd_version" "$pkg/cmd/ctr@$containerd_version"
GOBIN="$tmp" CGO_ENABLED=0 go install -trimpath -tags "urfave_cli_no_docs no_grpc" \
	-ldflags "-s -w -X $pkg/version.Version=$containerd_version -X $pkg/version.Revision=module" \
	"$pkg/cmd/containerd-shim-runc-v2@$containerd_version"
# runc's Makefile adds the libpathrs tag, which needs a Rust library Debian does not ship; without
# it runc uses its Go fallback for the same safe path resolution.
GOBIN="$tmp" CGO_ENABLED=1 go install -trimpath -tags "seccomp urfave_cli_no_docs" \
	-ldflags "-s -w -X main.version=${runc_version#v} -X main.gitCommit=module" \
	"github.com/opencontainers/runc@$runc_version"
echo "built the runtime in $((SECONDS - start))s"
rm -f "$dir/.stamp"
for b in "${bins[@]}"; do mv -f "$tmp/$b" "$dir/$b"; done
echo "$want" >"$tmp/.stamp"
mv -f "$tmp/.stamp" "$dir/.stamp"
echo "containerd $containerd_version and runc $runc_version ready in $dir (stamp ${want:0:12})"
