#!/usr/bin/env bash
# Runs govulncheck on the product (both builds of linkerd-cni) and on the release tooling (tools/)
# against an offline copy of the Go vulnerability database, built from the golang.org/x/vulndb
# module at VULNDB_VERSION: the online database is never asked, and a new advisory changes the
# result only when that pin moves.
#
# Usage (`make vulncheck` sets the versions):
#   GOVULNCHECK_VERSION=v1.9.0 VULNDB_VERSION=v0.0.0-... hack/vulncheck.sh
#
# The database is built once per pin into $VULNDB_CACHE/$VULNDB_VERSION (default
# /var/cache/proxy-init-vulndb), by vulndb's own cmd/indexdb from the module's data/osv, in the
# layout `govulncheck -db file://` reads, and reused afterwards. Both tools run with `go run
# module@version`, outside this module's go.mod; their zips are checked against Go's checksum
# database when first downloaded, as every module is. govulncheck exits non-zero when the code
# calls a vulnerable symbol (a vulnerable module the code never calls is not a finding).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

: "${GOVULNCHECK_VERSION:?set GOVULNCHECK_VERSION}" "${VULNDB_VERSION:?set VULNDB_VERSION}"
db="${VULNDB_CACHE:-/var/cache/proxy-init-vulndb}/$VULNDB_VERSION"

if [[ ! -f $db/index/modules.json ]]; then
	mkdir -p "$(dirname "$db")"
	tmp="$(mktemp -d "$(dirname "$db")/.build.XXXXXX")"
	trap 'rm -rf "$tmp"' EXIT
	echo "building the vulnerability database golang.org/x/vulndb@$VULNDB_VERSION into $db ..."
	# From the empty directory: `go mod download` leaves this module's go.sum alone.
	src="$(cd "$tmp" && go mod download -json "golang.org/x/vulndb@$VULNDB_VERSION" |
		sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
	(cd "$tmp" && go run "golang.org/x/vulndb/cmd/indexdb@$VULNDB_VERSION" -vulns "$src/data/osv" -out "$tmp/db")
	# Renamed whole, so a reader never sees half a database; a concurrent run that got there
	# first leaves the same database.
	mv -T "$tmp/db" "$db" 2>/dev/null || [[ -f $db/index/modules.json ]]
fi

govulncheck() {
	go run "golang.org/x/vuln/cmd/govulncheck@$GOVULNCHECK_VERSION" -db "file://$db" "$@"
}
echo "govulncheck@$GOVULNCHECK_VERSION, database golang.org/x/vulndb@$VULNDB_VERSION"
govulncheck ./...
govulncheck -tags pluginonly ./cmd/linkerd-cni
# The release tooling is its own module (tools/): what it calls is checked there.
(cd tools && govulncheck ./...)
