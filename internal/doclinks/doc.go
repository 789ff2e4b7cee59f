// Package doclinks checks the project's documentation: every relative link in README.md,
// CONTRIBUTING.md and docs/*.md must name a file or directory of the repository, and every
// #anchor must name a heading of the page it points at, as GitHub derives anchors from headings.
//
// It is all test: the checker lives in its test files, so no program links it (the dead-code
// check in make test holds that).
//
// Limits: inline links only ([text](target)); reference-style links and links inside code are
// not checked, nor are absolute URLs (that would need the network).
//
// # More checks
//
// Besides the links: the apt packages the pages name are the Makefile's; migration.md's list of our
// own chart values is complete; every `helm install` of the chart in a command block creates and
// labels the namespace first (the labels of deploy/linkerd-cni/00-namespace.yaml), and none uses
// --create-namespace.
package doclinks
