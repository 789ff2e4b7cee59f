//go:build !amd64 && !arm64

package netnsutil

// There is no entry hook for this architecture: EntryHookError says so, and pods with their own
// user namespace are written to only in the modes that need no helper.
const hookSupported = false
