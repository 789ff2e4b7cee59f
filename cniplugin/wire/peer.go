package wire

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
)

// Peer is the process at the other end of the agent's connection, as far as CheckPeer found it.
type Peer struct {
	// PID is the peer's PID in the PID namespace of the /proc it was checked in (-1: unknown).
	PID int
	// UID is SO_PEERCRED's, in the agent's user namespace (-1: unknown).
	UID int
}

// CheckPeer identifies conn's peer and refuses it, with a CodeRefused *Error, unless it holds
// CAP_SYS_ADMIN in the initial user namespace, as the plugin the container runtime runs does.
// hostProc is the node's /proc, mounted read-only in the agent's container.
//
// The peer is the process SO_PEERPIDFD names (Linux 6.5): the agent runs in a PID namespace of
// its own, where SO_PEERCRED's PID of a process outside it is 0, so the PID is read from the
// pidfd's fdinfo through hostProc, whose PID namespace is the node's. The capabilities are its
// status's CapEff, the user namespace is compared through uid_map (readable without ptrace access
// to the peer, unlike ns/user), and the pidfd is read again afterwards: if it still names that
// PID, the files read were the peer's and not those of a process that reused its PID. Before
// Linux 6.5 the checks read SO_PEERCRED's PID in the agent's own /proc, without that last proof;
// a peer whose PID is not visible there is refused.
//
// Limit: a user namespace whose uid_map maps every ID to itself passes for the initial one; only
// a process with CAP_SETUID in the initial namespace can make one.
func CheckPeer(conn *net.UnixConn, hostProc string) (Peer, error) {
	p := Peer{PID: -1, UID: -1}
	raw, err := conn.SyscallConn()
	if err != nil {
		return p, Errorf(CodeRefused, "cannot identify the peer: %v", err)
	}
	pidfd, pidfdErr := -1, error(nil)
	ctlErr := raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			p.PID, p.UID = int(cred.Pid), int(cred.Uid)
		}
		pidfd, pidfdErr = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PEERPIDFD)
	})
	switch {
	case ctlErr != nil:
		return p, Errorf(CodeRefused, "cannot identify the peer: %v", ctlErr)
	case pidfdErr == nil:
		defer unix.Close(pidfd)
		return p, checkPIDFD(&p, hostProc, pidfd)
	case !errors.Is(pidfdErr, unix.ENOPROTOOPT):
		return p, Errorf(CodeRefused, "cannot identify the peer: SO_PEERPIDFD: %v", pidfdErr)
	case p.PID <= 0:
		return p, Errorf(CodeRefused, "the peer's PID is not visible in the agent's PID namespace, and this kernel has no SO_PEERPIDFD (Linux 6.5) to find it in the node's")
	}
	return p, checkProcess("/proc", p.PID)
}

// checkPIDFD checks the process pidfd names, through hostProc, and sets p.PID.
func checkPIDFD(p *Peer, hostProc string, pidfd int) error {
	info := filepath.Join(hostProc, "self", "fdinfo", strconv.Itoa(pidfd))
	pid, err := fdinfoPID(info)
	switch {
	case err != nil:
		return Errorf(CodeRefused, "cannot find the peer's PID: %v", err)
	case pid == -1:
		return Errorf(CodeRefused, "the peer exited before it could be checked")
	case pid <= 0:
		return Errorf(CodeRefused, "the peer's PID is not visible in %s: is it the node's /proc?", hostProc)
	}
	p.PID = pid
	if err := checkProcess(hostProc, pid); err != nil {
		return err
	}
	if again, err := fdinfoPID(info); err != nil || again != pid {
		return Errorf(CodeRefused, "the peer exited while it was checked")
	}
	return nil
}

// fdinfoPID reads the Pid of a pidfd's fdinfo: -1 once the process has exited, 0 when it is not
// visible in that /proc's PID namespace.
func fdinfoPID(path string) (int, error) {
	v, err := statusField(path, "Pid")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(v)
}

// checkProcess refuses pid unless, in proc, it holds CAP_SYS_ADMIN and lives in the user
// namespace of proc's PID 1.
func checkProcess(proc string, pid int) error {
	dir := filepath.Join(proc, strconv.Itoa(pid))
	capEff, err := statusField(filepath.Join(dir, "status"), "CapEff")
	if err != nil {
		return Errorf(CodeRefused, "cannot read the peer's capabilities: %v", err)
	}
	caps, err := strconv.ParseUint(capEff, 16, 64)
	if err != nil {
		return Errorf(CodeRefused, "the peer's CapEff %q: %v", capEff, err)
	}
	if caps&(1<<unix.CAP_SYS_ADMIN) == 0 {
		return Errorf(CodeRefused, "the peer does not hold CAP_SYS_ADMIN (CapEff %s), as the plugin the container runtime runs does", capEff)
	}
	own, err := netnsutil.ReadProc(filepath.Join(dir, "uid_map"))
	if err != nil {
		return Errorf(CodeRefused, "cannot read the peer's user namespace: %v", err)
	}
	initial, err := netnsutil.ReadProc(filepath.Join(proc, "1", "uid_map"))
	if err != nil {
		return Errorf(CodeRefused, "cannot read the initial user namespace: %v", err)
	}
	if !bytes.Equal(own, initial) {
		return Errorf(CodeRefused, "the peer runs in a user namespace of its own (uid_map %q), where its capabilities are not the node's",
			strings.Join(strings.Fields(string(own)), " "))
	}
	return nil
}

// statusField returns the value of "name:" in a /proc status-like file.
func statusField(path, name string) (string, error) {
	b, err := netnsutil.ReadProc(path)
	if err != nil {
		return "", err
	}
	for l := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(l, ":"); ok && k == name {
			return strings.TrimSpace(v), nil
		}
	}
	return "", fmt.Errorf("%s: no %s", path, name)
}
