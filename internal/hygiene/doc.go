// Package hygiene holds the repository's tracked files to what a source tree should hold: no
// compiled binary (a build output committed by mistake stays in the history for good), and no
// file over MaxFileSize outside a testdata directory. It also holds every command to a plain
// `go build` (no flags, no tags, no cgo) giving a working binary, and every product function to
// MaxFuncLines.
//
// It is all test: the checks live in its test files, so no program links it.
//
// Limits: it reads `git ls-files` of the checkout it runs in, so it sees what is committed or
// staged, not untracked files (.gitignore keeps the usual build outputs out). The function-length
// check walks the work tree instead, so a new file counts before it is committed. The plain-build
// check needs the Go toolchain, and root for its one real write.
//
// TestProductFuncLength: no function or function literal outside _test.go files, test/, tools/,
// the test harnesses and the release tooling (notProduct) has a body over MaxFuncLines; it names
// each one that does, with its file and length.
package hygiene

// MaxFileSize is the largest file tracked outside testdata. Real sources and manifests are a few
// dozen KiB; anything near this bound is data that belongs in testdata, or a build output.
const MaxFileSize = 1 << 20

// MaxFuncLines is the longest body a product function may have, counted as the lines between its
// braces. A function past it is usually a switch over kinds that wants one type per kind, or a
// sequence of steps that wants a helper per step; either reads better than scrolling.
const MaxFuncLines = 80
