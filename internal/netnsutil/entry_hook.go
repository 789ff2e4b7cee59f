//go:build amd64 || arm64

package netnsutil

const hookSupported = true

// entry is the process's entry point in a binary linked with EntryHookFlag; see userns.go and
// entry_$GOARCH.s. Go never calls it.
func entry()
