#!/usr/bin/env bash
# Builds kube-node (kube-controller-manager, kube-scheduler and kubelet in one binary, see
# cmd/kube-node) for the end-to-end node of test/e2e, into a cache outside the repository so
# fresh clones on the same machine (CI) reuse it. Its own module and cache directory keep
# test/kube's kube-apiserver and etcd cache valid whatever changes here.
#
# Usage: test/e2e/kube/build.sh [--check] [--print-dir]
#   (no flag)    build if the cache is missing or stale, else do nothing
#   --check      exit 0 if the cache is up to date, 1 if not; build nothing
#   --print-dir  print the cache directory and exit
#
# Cache directory: $KUBE_NODE_CACHE, default /var/cache/proxy-init-kube/node. Staleness: a
# SHA-256 over this module's sources and `go version`, kept in $dir/.stamp. Concurrent runs are
# serialised with flock; the binary is installed by rename, then the stamp.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dir="${KUBE_NODE_CACHE:-/var/cache/proxy-init-kube/node}"
bin=kube-node

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

want="$(
	cd "$here"
	{
		find . -type f \( -name '*.go' -o -name go.mod -o -name go.sum -o -name build.sh \) |
			LC_ALL=C sort | xargs sha256sum
		go version
	} | sha256sum | cut -d' ' -f1
)"
up_to_date() { [[ -x "$dir/$bin" && "$(cat "$dir/.stamp" 2>/dev/null)" == "$want" ]]; }

if [[ ${1:-} == --check ]]; then
	up_to_date && { echo "$bin up to date in $dir"; exit 0; }
	echo "$bin missing or stale in $dir (run: make kube-node)"
	exit 1
fi

mkdir -p "$dir"
exec 9>"$dir/.lock"
flock -n 9 || { echo "waiting for another build of $bin in $dir"; flock 9; }
if up_to_date; then
	echo "$bin up to date in $dir (stamp ${want:0:12}); nothing to build"
	exit 0
fi

cd "$here"
kver="$(go list -m -f '{{.Version}}' k8s.io/kubernetes)"
major="${kver#v}" major="${major%%.*}"
minor="${kver#v*.}" minor="${minor%%.*}"
# The version variables the Kubernetes release build sets, so the node reports v1.x.y (the API
# server and kubelet compare versions) instead of v0.0.0-master.
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	ldflags+=" -X $pkg.gitVersion=$kver -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
	ldflags+=" -X $pkg.gitCommit=unknown -X $pkg.gitTreeState=clean"
done

tmp="$(mktemp -d "$dir/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "building $bin (kubernetes $kver) into $dir ..."
start=$SECONDS
CGO_ENABLED=0 go build -buildvcs=false -trimpath -ldflags "$ldflags" -o "$tmp/$bin" ./cmd/kube-node
echo "built $bin in $((SECONDS - start))s"
rm -f "$dir/.stamp"
mv -f "$tmp/$bin" "$dir/$bin"
echo "$want" >"$tmp/.stamp"
mv -f "$tmp/.stamp" "$dir/.stamp"
echo "$bin ready in $dir (stamp ${want:0:12})"
