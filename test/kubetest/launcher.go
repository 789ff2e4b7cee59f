package kubetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"

	"github.com/vishvananda/netlink"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
)

// errStopped is returned by a launcher that has been closed.
var errStopped = errors.New("kubetest: cluster stopped")

// launcher owns one OS thread, locked for the cluster's whole life and, when a
// network namespace is given, switched into it. Everything that must happen
// "inside" the cluster's namespace runs on that thread: forking etcd and
// kube-apiserver (a child inherits the network namespace of the thread that
// forks it), picking free ports and creating client sockets (a socket keeps
// the namespace it was created in).
//
// Keeping the thread for the whole life also keeps Pdeathsig honest: Linux
// sends it when the forking *thread* exits, so a short-lived thread would
// kill the children early.
type launcher struct {
	mu     sync.Mutex
	closed bool
	reqs   chan func()
	done   chan struct{}
	netns  string
}

// newLauncher starts the thread. With a netnsPath it enters that namespace
// and brings its loopback interface up, since a fresh namespace has lo down.
func newLauncher(netnsPath string) (*launcher, error) {
	l := &launcher{reqs: make(chan func()), done: make(chan struct{}), netns: netnsPath}
	ready := make(chan error, 1)
	go func() {
		defer close(l.done)
		if netnsPath == "" {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			ready <- nil
			l.serve()
			return
		}
		// Do locks the thread, switches it and switches it back when serve
		// returns, after the children are gone.
		err := netnsutil.Do(netnsPath, func() error {
			if err := loopbackUp(); err != nil {
				return fmt.Errorf("netns %s: %w", netnsPath, err)
			}
			ready <- nil
			l.serve()
			return nil
		})
		if err != nil {
			select {
			case ready <- err:
			default: // already reported ready; nothing is waiting
			}
		}
	}()
	if err := <-ready; err != nil {
		return nil, err
	}
	return l, nil
}

func (l *launcher) serve() {
	for f := range l.reqs {
		f()
	}
}

// do runs f on the launcher's thread and waits for it.
func (l *launcher) do(f func()) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return errStopped
	}
	finished := make(chan struct{})
	l.reqs <- func() { f(); close(finished) }
	l.mu.Unlock()
	<-finished
	return nil
}

// close ends the thread. Call it only after the children have exited.
func (l *launcher) close() {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.reqs)
	}
	l.mu.Unlock()
	<-l.done
}

// dial connects from inside the launcher's namespace. Only the socket()
// call needs the thread; the connect completes on Go's poller.
func (l *launcher) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	if l.netns == "" {
		return d.DialContext(ctx, network, addr)
	}
	var (
		conn net.Conn
		err  error
	)
	if derr := l.do(func() { conn, err = d.DialContext(ctx, network, addr) }); derr != nil {
		return nil, derr
	}
	return conn, err
}

// freePorts returns n distinct TCP ports that were free on 127.0.0.1 in the
// launcher's namespace. The listeners are held until all n are chosen so the
// kernel cannot hand the same port out twice; another process could still
// take one before the child binds it, which is acceptable for tests.
func (l *launcher) freePorts(n int) ([]int, error) {
	var (
		ports []int
		err   error
	)
	derr := l.do(func() {
		var ls []net.Listener
		defer func() {
			for _, ln := range ls {
				_ = ln.Close()
			}
		}()
		for range n {
			ln, lerr := net.Listen("tcp", "127.0.0.1:0")
			if lerr != nil {
				err = fmt.Errorf("pick a free port: %w", lerr)
				return
			}
			ls = append(ls, ln)
			ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
		}
	})
	if derr != nil {
		return nil, derr
	}
	return ports, err
}

// loopbackUp sets lo up in the current thread's network namespace.
func loopbackUp() error {
	lo, err := netlink.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("find lo: %w", err)
	}
	if err := netlink.LinkSetUp(lo); err != nil {
		return fmt.Errorf("set lo up: %w", err)
	}
	return nil
}
