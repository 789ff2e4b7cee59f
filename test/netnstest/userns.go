package netnstest

import (
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// UserNSHostRoot is the host UID and GID that root of NewUserNS's user namespace maps to: UID n
// inside is UserNSHostRoot+n on the host, for n below 65536, as the kubelet maps a pod with
// hostUsers: false. A socket of the pod's proxy (UID 2102 inside) belongs to host UID 102102.
const UserNSHostRoot = 100000

// NewUserNS creates a network namespace owned by a fresh user namespace that maps 0-65535 to
// UserNSHostRoot and up, with lo up, removed again by t.Cleanup (the user namespace lives as
// long as the network namespace). Both namespaces are created in one clone, and the maps written
// afterwards, as containerd creates a pod's; the user namespace allows setgroups, as the
// kubelet's do.
func NewUserNS(t testing.TB) *NS {
	t.Helper()
	RequireRoot(t)
	idMap := []syscall.SysProcIDMap{{ContainerID: 0, HostID: UserNSHostRoot, Size: 65536}}
	// cat, blocked on its standard input, holds the namespaces until they are bind-mounted.
	holder := exec.Command("cat")
	holder.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  unix.CLONE_NEWUSER | unix.CLONE_NEWNET,
		UidMappings: idMap, GidMappings: idMap, GidMappingsEnableSetgroups: true,
	}
	stdin, err := holder.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatalf("start a process in a new user and network namespace: %v", err)
	}
	defer func() {
		stdin.Close()
		holder.Wait()
	}()
	name := make([]byte, 8)
	rand.Read(name)
	path := filepath.Join(runNetNS, fmt.Sprintf("userns-%x", name))
	if err := sharedRunNetNS(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o444); err != nil {
		t.Fatal(err)
	}
	src := fmt.Sprintf("/proc/%d/ns/net", holder.Process.Pid)
	if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		t.Fatalf("bind-mount %s on %s: %v", src, path, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(path, 0); err != nil {
			t.Errorf("unmount netns %s: %v", path, err)
		}
		if err := os.Remove(path); err != nil {
			t.Errorf("remove %s: %v", path, err)
		}
	})
	return setUp(t, &NS{name: "pod", path: path})
}

// runNetNS is where namespaces are bind-mounted, as containernetworking's testutils (NewNetNS)
// mounts them.
const runNetNS = "/var/run/netns"

// sharedRunNetNS makes runNetNS a shared mount point of its own, as testutils does before its first
// namespace, so that a bind mount made here before testutils' first one is not left covered (and
// busy) by the mount point testutils makes of the directory later.
func sharedRunNetNS() error {
	if err := os.MkdirAll(runNetNS, 0o755); err != nil {
		return err
	}
	err := unix.Mount("", runNetNS, "none", unix.MS_SHARED|unix.MS_REC, "")
	if err == unix.EINVAL { // not a mount point yet
		if err = unix.Mount(runNetNS, runNetNS, "none", unix.MS_BIND|unix.MS_REC, ""); err == nil {
			err = unix.Mount("", runNetNS, "none", unix.MS_SHARED|unix.MS_REC, "")
		}
	}
	if err != nil {
		return fmt.Errorf("make %s a shared mount point: %w", runNetNS, err)
	}
	return nil
}
