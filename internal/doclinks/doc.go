// Package doclinks checks the project's documentation: every relative link in README.md,
// CONTRIBUTING.md and docs/*.md must name a file or directory of the repository, and every
// #anchor must name a heading of the page it points at, as GitHub derives anchors from headings.
//
// Limits: inline links only ([text](target)); reference-style links and links inside code are
// not checked, nor are absolute URLs (that would need the network).
package doclinks
