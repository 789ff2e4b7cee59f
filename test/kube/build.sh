#!/usr/bin/env bash
# Builds kube-apiserver and etcd for the integration tests (internal/kubetest)
# into a cache directory outside the repository, so fresh clones on the same
# machine (CI) reuse them. A cold build takes about 11 minutes on 2 cores.
#
# Usage: test/kube/build.sh [--check] [--print-dir]
#   (no flag)    build if the cache is missing or stale, else do nothing
#   --check      exit 0 if the cache is up to date, 1 if not; build nothing
#   --print-dir  print the cache directory and exit
#
# Cache directory: $KUBE_BIN_CACHE, default /var/cache/proxy-init-kube/bin.
# Staleness: a SHA-256 over this module's sources (go.mod, go.sum, *.go,
# this script) and `go version` is stored in $dir/.stamp; the binaries are
# rebuilt only when it changes. Concurrent runs are serialised with flock.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${KUBE_BIN_CACHE:-/var/cache/proxy-init-kube/bin}"
bins=(kube-apiserver etcd)

mode=build
case "${1:-}" in
"") ;;
--check) mode=check ;;
--print-dir)
	echo "$dir"
	exit 0
	;;
*)
	echo "usage: $0 [--check|--print-dir]" >&2
	exit 2
	;;
esac

# stamp hashes everything that decides what the binaries contain. go.sum
# pins every dependency, so the module cache's state does not matter.
stamp() {
	(
		cd "$here"
		find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum -o -name build.sh \) \
			-not -path './.cache/*' | LC_ALL=C sort | xargs sha256sum
		go version
	) | sha256sum | cut -d' ' -f1
}

up_to_date() {
	local want="$1" b
	[[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$want" ]] || return 1
	for b in "${bins[@]}"; do
		[[ -x "$dir/$b" ]] || return 1
	done
}

want="$(stamp)"
if [[ $mode == check ]]; then
	if up_to_date "$want"; then
		echo "kube test binaries up to date in $dir"
		exit 0
	fi
	echo "kube test binaries missing or stale in $dir (run: make kube-bins)"
	exit 1
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
if ! flock -n 9; then
	echo "waiting for another build of the kube test binaries in $dir"
	flock 9
fi
if up_to_date "$want"; then
	echo "kube test binaries up to date in $dir (stamp ${want:0:12}); nothing to build"
	exit 0
fi

cd "$here"
kver="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
# The version variables the Kubernetes release build sets (server and
# client-go's user agent), so the server reports v1.x.y, not v0.0.0-master.
major="$(echo "$kver" | sed -E 's/^v([0-9]+)\..*/\1/')"
minor="$(echo "$kver" | sed -E 's/^v[0-9]+\.([0-9]+)\..*/\1/')"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$kver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitCommit=unknown -X $pkg.gitTreeState=clean"
done

tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
for b in "${bins[@]}"; do
	echo "building $b (kubernetes $kver) into $dir ..."
	start=$SECONDS
	CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "$ldflags" -o "$tmp/$b" "./cmd/$b"
	echo "built $b in $((SECONDS - start))s"
done
# Install the binaries first and the stamp last, each by rename, so a reader
# never sees a fresh stamp beside old or half-written binaries.
rm -f "$dir/.stamp"
for b in "${bins[@]}"; do
	mv -f "$tmp/$b" "$dir/$b"
done
echo "$want" >"$tmp/.stamp"
mv -f "$tmp/.stamp" "$dir/.stamp"
echo "kube test binaries ready in $dir (stamp ${want:0:12})"
