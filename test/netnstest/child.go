package netnstest

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"testing"
)

// A test that must run a real command as its own process (its exit code, its sockets on every
// thread) re-executes its test binary inside a namespace. The child checks the namespace before
// doing anything, so a harness bug can never make it listen or connect in the machine's root one.

// childNetNSEnv carries the inode of the namespace the child must be in.
const childNetNSEnv = "NETNSTEST_CHILD_NETNS_INODE"

// ChildRefused is a child's exit code when it is not in the namespace it was meant for.
const ChildRefused = 3

// ChildMain belongs at the top of TestMain. In a test binary re-executed with ChildEnv, it runs
// main and exits with its code, after checking the namespace; otherwise it returns.
func ChildMain(main func() int) {
	want, ok := os.LookupEnv(childNetNSEnv)
	if !ok {
		return
	}
	var st syscall.Stat_t
	if err := syscall.Stat("/proc/self/ns/net", &st); err != nil || strconv.FormatUint(st.Ino, 10) != want {
		fmt.Fprintf(os.Stderr, "test child: not in the expected network namespace (inode %d, want %s, err %v)\n", st.Ino, want, err)
		os.Exit(ChildRefused)
	}
	os.Exit(main())
}

// ChildEnv is the environment entry that makes a re-executed test binary a ChildMain child meant
// for the namespace at nsPath. Start the child from inside that namespace.
func ChildEnv(t testing.TB, nsPath string) string {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(nsPath, &st); err != nil {
		t.Fatalf("namespace %s: %v", nsPath, err)
	}
	return childNetNSEnv + "=" + strconv.FormatUint(st.Ino, 10)
}
