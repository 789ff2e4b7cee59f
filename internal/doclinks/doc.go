// Package doclinks checks the documentation (all in its tests): every relative link in README.md,
// CONTRIBUTING.md and docs/*.md names a file of the repository, and every #anchor a heading of
// its page. Limits: inline links only; no absolute URLs (that would need the network).
//
// # More checks
//
// The apt packages the pages name are the Makefile's; migration.md lists all our chart values;
// every `helm install` of the chart creates and labels the namespace first (as
// deploy/linkerd-cni/00-namespace.yaml), and none uses --create-namespace.
package doclinks
