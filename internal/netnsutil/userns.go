package netnsutil

// Writing into a network namespace that another user namespace owns (a Kubernetes pod with
// hostUsers: false). The kernel's xtables owner match (iptables --uid-owner and --gid-owner, over
// nft_compat or iptables-legacy) refuses a rule with EINVAL unless the writing task's user
// namespace is the one that owns the network namespace, so such rules can only be written from
// inside the pod's user namespace. A Go process cannot join a user namespace: setns(2) refuses
// CLONE_NEWUSER to a process with more than one thread, and the runtime starts threads before any
// Go code runs. So the writer is a helper process, this binary again, that joins the pod's user
// and network namespaces in its entry hook (entry_*.s), before the runtime starts, and only then
// runs Go.
//
// The hook is the program's ELF entry point when the binary is linked with EntryHookFlag (make
// build does; so do the tests that build our commands). On every start it records that it ran;
// when argv[0] is HelperName it joins the user namespace on descriptor 3 and the network namespace
// on descriptor 4, and records the first failure's step and errno for the Go side to report.
// Then it jumps to the Go runtime's own entry point. Ordinary starts pay one comparison of argv[0].

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// HelperName is argv[0] of the helper process, the entry hook's signal to join namespaces.
const HelperName = "proxy-init-userns"

// EntryHookSymbol is the entry hook's symbol; EntryHookFlag is the linker flag that makes it the
// entry point. Every build of proxy-init and linkerd-cni must pass it (-ldflags).
const (
	EntryHookSymbol = "github.com/kubemesh/proxy-init/internal/netnsutil.entry"
	EntryHookFlag   = "-E=" + EntryHookSymbol
)

// Written by the entry hook before the runtime starts (so: no pointers, no initialisation code).
var (
	hookRan   uint64 // 1 on every start of a binary linked with the hook
	hookStep  uint64 // the step that failed: 1 joining the user namespace, 2 the network namespace
	hookErrno uint64 // its errno
)

// helperArg0 is HelperName, NUL-terminated, for the hook to compare argv[0] with
// (TestHelperArg0 holds them equal). A constant array is static data, there before the runtime.
var helperArg0 = [...]byte{'p', 'r', 'o', 'x', 'y', '-', 'i', 'n', 'i', 't', '-', 'u', 's', 'e', 'r', 'n', 's', 0}

// EntryHookError says why this binary cannot start the helper: it was linked without
// EntryHookFlag, or is built for an architecture the hook does not exist for. nil means it can.
func EntryHookError() error {
	if !hookSupported {
		return fmt.Errorf("the entry hook that enters pods' user namespaces exists for amd64 and arm64, not %s", runtime.GOARCH)
	}
	if hookRan == 0 {
		return fmt.Errorf("this binary was linked without its entry hook (go build -ldflags=%s; make build passes it)", EntryHookFlag)
	}
	return nil
}

// IsHelper reports whether this process was started as the helper (argv[0] is HelperName),
// whether or not the hook ran.
func IsHelper() bool { return len(os.Args) > 0 && os.Args[0] == HelperName }

// BecomeHelper finishes what the entry hook began, in the helper: it reports a failure the hook
// recorded, or that there was no hook, and then makes the process root of the pod's user
// namespace (uid and gid 0 there, no supplementary groups), so that the iptables binaries it runs
// keep their capabilities across exec as they would in the pod's own init container. After it,
// every thread of the process is in the pod's user and network namespaces.
func BecomeHelper() error {
	if err := EntryHookError(); err != nil {
		return err
	}
	if hookStep != 0 {
		what := [...]string{1: "join the pod's user namespace", 2: "join the pod's network namespace"}
		step := "enter the namespaces"
		if hookStep < uint64(len(what)) {
			step = what[hookStep]
		}
		errno := syscall.Errno(hookErrno)
		hint := ""
		if errno == unix.EPERM {
			hint = " (this needs CAP_SYS_ADMIN)"
		}
		return fmt.Errorf("%s: setns: %w%s", step, errno, hint)
	}
	// syscall's set*id change every thread of the process, not just the calling one.
	if err := syscall.Setgroups(nil); err != nil && !errors.Is(err, unix.EPERM) {
		// EPERM: the user namespace forbids setgroups (/proc/PID/setgroups is "deny"); the
		// host's groups are unmapped there and grant nothing in the pod's namespaces.
		return fmt.Errorf("drop supplementary groups in the pod's user namespace: %w", err)
	}
	if err := syscall.Setresgid(0, 0, 0); err != nil {
		return fmt.Errorf("become gid 0 of the pod's user namespace (is gid 0 mapped?): %w", err)
	}
	if err := syscall.Setresuid(0, 0, 0); err != nil {
		return fmt.Errorf("become uid 0 of the pod's user namespace (is uid 0 mapped?): %w", err)
	}
	return nil
}

// ForeignUserNS returns the user namespace that owns the network namespace at nsPath ("" for the
// calling thread's) when that is not the caller's own user namespace, and nil when it is. It costs
// an open, an ioctl and two stats, so callers can ask it for every namespace they write to.
//
// A namespace whose owner the caller may not see (an ancestor of its own user namespace: the
// kernel answers EPERM) or a kernel without NS_GET_USERNS (before 4.9) gives nil: the caller
// cannot enter such an owner anyway, and writes as it always did.
func ForeignUserNS(nsPath string) (*os.File, error) {
	if nsPath == "" {
		nsPath = "/proc/thread-self/ns/net"
	}
	netns, err := os.Open(nsPath)
	if err != nil {
		return nil, fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	defer netns.Close()
	fd, err := unix.IoctlRetInt(int(netns.Fd()), unix.NS_GET_USERNS)
	if errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("ask netns %s for its user namespace: %w", nsPath, err)
	}
	owner := os.NewFile(uintptr(fd), "user namespace of "+nsPath)
	var have, ours unix.Stat_t
	if err := unix.Fstat(fd, &have); err != nil {
		owner.Close()
		return nil, fmt.Errorf("stat the user namespace of netns %s: %w", nsPath, err)
	}
	if err := unix.Stat("/proc/self/ns/user", &ours); err != nil {
		owner.Close()
		return nil, fmt.Errorf("stat our own user namespace: %w", err)
	}
	if have.Dev == ours.Dev && have.Ino == ours.Ino {
		owner.Close()
		return nil, nil
	}
	return owner, nil
}

// NSLabel names a namespace file as the kernel does ("user:[4026532281]"), for messages.
func NSLabel(f *os.File) string {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return f.Name()
	}
	kind := "user"
	if t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err == nil && t != unix.CLONE_NEWUSER {
		kind = nsTypes[t]
	}
	return kind + ":[" + strconv.FormatUint(st.Ino, 10) + "]"
}

// HelperCommand returns the command that starts exe (a binary linked with the entry hook, usually
// /proc/self/exe) as the helper inside the user namespace userns and the network namespace at
// nsPath. The caller sets its standard streams and runs it; the helper's Go side calls
// BecomeHelper. The environment is PATH alone: the helper may run iptables binaries, and nothing
// else of the caller's (CNI_COMMAND, say) should steer it.
func HelperCommand(ctx context.Context, exe string, userns *os.File, nsPath string) (*exec.Cmd, func(), error) {
	if nsPath == "" {
		nsPath = "/proc/thread-self/ns/net"
	}
	netns, err := os.Open(nsPath)
	if err != nil {
		return nil, nil, fmt.Errorf("open netns %s: %w", nsPath, err)
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Args = []string{HelperName}
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	// Descriptors 3 and 4, where the hook looks.
	cmd.ExtraFiles = []*os.File{userns, netns}
	return cmd, func() { netns.Close() }, nil
}
