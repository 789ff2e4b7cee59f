package runner

// The namespace locks. Writing is read, restore (per family), maybe roll back: two runs
// interleaving those steps duplicate jumps, mix families of two configs, or roll back each other's
// work. So every writer holds the namespace's lock, exclusive to write and shared to read. Both
// locks are flock(2), and the host lock is taken first, so no two callers wait for each other:
//
//   - The in-pod lock (Lock), on the namespace's own nsfs file: every process that opens the
//     namespace, from any mount namespace, locks the same inode, and no file is made or removed.
//     But any process in the pod can open /proc/self/ns/net and hold it forever. proxy-init in its
//     pod takes it, to meet another proxy-init of the same pod.
//   - The host lock (HostLock), on a file named after the nsfs device and inode in a root-only
//     directory (rootonly). The CNI plugin and the node agent take it, so no pod can hold them up;
//     proxy-init --netns on the node takes it too when the directory is there, then the in-pod one.

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/internal/rootonly"
)

// DefaultLockWait bounds the wait for the namespace's locks when the Target sets no other: long
// enough to outlast another writer's apply, short enough that a lock held for good fails the ADD,
// or proxy-init, visibly. It is not the xtables lock's bound (xtables.WaitTimeout).
const DefaultLockWait = 10 * time.Second

// DefaultHostLockDir is the host locks' directory on a node, in linkerd-cni's state directory.
const DefaultHostLockDir = "/var/run/linkerd-cni/locks"

// BusyError is a lock that someone else still held when the wait ran out.
type BusyError struct {
	Wait time.Duration
	// Lock names the lock: the host lock's file, or the in-pod lock.
	Lock string
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("another proxy-init or linkerd-cni is still writing rules in this network namespace after %s; gave up waiting (lock: %s)", e.Wait, e.Lock)
}

// enterLocked runs fn inside the target's namespace holding the locks it asks for.
func enterLocked(t Target, exclusive bool, fn func() error) error {
	return netnsutil.Do(t.NetNS, func() error {
		unlock, err := t.lock(exclusive)
		if err != nil {
			return err
		}
		defer unlock()
		return fn()
	})
}

// lock takes the target's locks, the host one first, within one wait, and returns their release.
func (t Target) lock(exclusive bool) (func(), error) {
	wait := cmp.Or(t.LockWait, DefaultLockWait)
	deadline := time.Now().Add(wait)
	host := func() {}
	if t.HostLockDir != "" {
		l, err := HostLock(t.HostLockDir, t.NetNS, exclusive, wait)
		if err != nil {
			return nil, err
		}
		host = l.Release
		if t.RemoveHostLock && exclusive {
			host = func() { _ = l.Remove() }
		}
		if !t.InPodLock {
			return host, nil
		}
	}
	inPod, err := Lock(t.NetNS, exclusive, time.Until(deadline))
	if busy := (*BusyError)(nil); errors.As(err, &busy) {
		busy.Wait = wait // both locks' wait
	}
	// Without /proc (a chroot, a container without it) the current namespace cannot be named.
	if errors.Is(err, fs.ErrNotExist) && t.NetNS == "" {
		t.log().Warn("no /proc: writing without the namespace lock, so a concurrent writer in this namespace is not waited for", "error", err)
		inPod, err = func() {}, nil
	}
	if err != nil {
		host()
		return nil, err
	}
	return func() { inPod(); host() }, nil
}

// Lock takes the in-pod lock of the network namespace at path (the calling thread's for ""),
// shared or exclusive, waiting at most wait, and returns its release.
func Lock(path string, exclusive bool, wait time.Duration) (unlock func(), err error) {
	deadline := time.Now().Add(wait)
	f, err := os.Open(cmp.Or(path, "/proc/thread-self/ns/net"))
	if err != nil {
		return nil, fmt.Errorf("open the network namespace to lock it: %w", err)
	}
	busy := &BusyError{Wait: wait, Lock: "the namespace's own file, which any process in the pod can hold too"}
	if err := flockUntil(f, exclusive, deadline, busy); err != nil {
		f.Close()
		return nil, err
	}
	return func() { f.Close() }, nil
}

// HostLockFile is a held host lock.
type HostLockFile struct {
	f    *os.File
	path string
}

// HostLock takes the host lock of the network namespace at netns (the calling thread's for "")
// in dir (made 0700, refused when others may reach it), shared or exclusive, waiting at most wait.
// A lock file removed while this call waited is taken anew, so a removal never lets two holders in.
func HostLock(dir, netns string, exclusive bool, wait time.Duration) (*HostLockFile, error) {
	netns = cmp.Or(netns, "/proc/thread-self/ns/net")
	var ns unix.Stat_t
	if err := unix.Stat(netns, &ns); err != nil {
		return nil, fmt.Errorf("stat the network namespace %s to name its lock: %w", netns, err)
	}
	if err := rootonly.Make(dir); err != nil {
		return nil, fmt.Errorf("the namespace locks' directory: %w", err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%d-%d", ns.Dev, ns.Ino)) // nsfs device and inode
	deadline := time.Now().Add(wait)
	for {
		f, err := openLockFile(path)
		if err != nil {
			return nil, err
		}
		if err := flockUntil(f, exclusive, deadline, &BusyError{Wait: wait, Lock: path}); err != nil {
			f.Close()
			return nil, err
		}
		same, err := stillAt(f, path)
		if same {
			return &HostLockFile{f: f, path: path}, nil
		}
		f.Close() // removed while we waited: take the new one, unless stat failed
		if err != nil {
			return nil, err
		}
	}
}

// Release releases the lock.
func (l *HostLockFile) Release() { l.f.Close() }

// Remove removes the lock's file, then releases the lock. The holder must hold it exclusively:
// nobody else then holds the file, and whoever waits for it takes the next one.
func (l *HostLockFile) Remove() error {
	defer l.f.Close()
	if err := os.Remove(l.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove the lock file: %w", err)
	}
	return nil
}

// isHostLockName matches the names of host lock files (HostLock's: device, '-', inode). A
// function, not a regular expression: a package-level one is compiled at every start of the
// plugin, which runs this only in its sweep.
func isHostLockName(name string) bool {
	dev, ino, ok := strings.Cut(name, "-")
	_, errDev := strconv.ParseUint(dev, 10, 64)
	_, errIno := strconv.ParseUint(ino, 10, 64)
	return ok && errDev == nil && errIno == nil
}

// SweepHostLocks removes from dir every lock file nobody holds, and returns how many: a lock file
// holds no state, and the next writer makes it again, so the files of namespaces gone without a
// DEL (a runtime that lost it, a plugin killed first) go too. A missing dir holds nothing.
func SweepHostLocks(dir string) (int, error) {
	if err := rootonly.Check(dir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("the namespace locks' directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range entries {
		if !e.Type().IsRegular() || !isHostLockName(e.Name()) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue // gone since the listing
		}
		inUse := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil // someone holds it
		if same, _ := stillAt(f, path); same && !inUse {
			if err := os.Remove(path); err != nil {
				errs = append(errs, err)
			} else {
				n++
			}
		}
		f.Close()
	}
	return n, errors.Join(errs...)
}

// openLockFile opens or creates the host lock file at path, refusing all but our regular files.
func openLockFile(path string) (*os.File, error) {
	// A plain open: os.OpenFile would offer the file to the poller (four more system calls).
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open the lock file: %w", &os.PathError{Op: "open", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("stat the lock file %s: %w", path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() {
		f.Close()
		return nil, fmt.Errorf("refusing the lock file %s: not a regular file of uid %d", path, os.Geteuid())
	}
	return f, nil
}

// stillAt reports whether path still names the file f has open.
func stillAt(f *os.File, path string) (bool, error) {
	var held, now unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &held); err != nil {
		return false, fmt.Errorf("stat the lock file %s: %w", path, err)
	}
	if err := unix.Stat(path, &now); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("stat the lock file %s: %w", path, err)
	}
	return held.Dev == now.Dev && held.Ino == now.Ino, nil
}

// flockUntil takes flock on f, polling until deadline (then busy). The descriptor is made
// inheritable: an iptables-restore started under the lock keeps it, so a writer killed while its
// restore runs keeps the namespace locked until that restore finishes.
func flockUntil(f *os.File, exclusive bool, deadline time.Time, busy *BusyError) error {
	if _, err := unix.FcntlInt(f.Fd(), unix.F_SETFD, 0); err != nil {
		return fmt.Errorf("lock the network namespace: %w", err)
	}
	how := unix.LOCK_SH
	if exclusive {
		how = unix.LOCK_EX
	}
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		err := unix.Flock(int(f.Fd()), how|unix.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			err = &fs.PathError{Op: "flock", Path: f.Name(), Err: err}
			return fmt.Errorf("lock the network namespace: %w", err)
		}
		if time.Now().After(deadline) {
			return busy
		}
		time.Sleep(pause)
	}
}
