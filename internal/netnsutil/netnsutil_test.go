package netnsutil_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// threadNetNS returns the inode of the calling thread's network namespace.
// The caller must have locked its OS thread, or be inside Do.
func threadNetNS(t *testing.T) uint64 {
	t.Helper()
	fi, err := os.Stat("/proc/thread-self/ns/net")
	if err != nil {
		t.Fatalf("stat thread netns: %v", err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat %s: %v", path, err)
	}
	return fi.Sys().(*syscall.Stat_t).Ino
}

func TestDoEmptyPathRunsInCurrentNamespace(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := threadNetNS(t)
	var inside uint64
	if err := netnsutil.Do("", func() error { inside = threadNetNS(t); return nil }); err != nil {
		t.Fatalf("Do: %v", err)
	}
	if inside != before {
		t.Fatalf("fn ran in netns %d, want the current one %d", inside, before)
	}
	sentinel := errors.New("sentinel")
	if err := netnsutil.Do("", func() error { return sentinel }); !errors.Is(err, sentinel) {
		t.Fatalf("Do returned %v, want fn's error", err)
	}
}

func TestDo(t *testing.T) {
	target := netnstest.NewNetNS(t)
	want := inode(t, target.Path())

	regular := filepath.Join(t.TempDir(), "not-a-netns")
	if err := os.WriteFile(regular, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	sentinel := errors.New("sentinel")

	tests := []struct {
		name    string
		path    string
		fn      func() error
		wantErr string // substring; "" means success
		wantIs  error
	}{
		{
			name: "fn runs inside the namespace",
			path: target.Path(),
			fn: func() error {
				if got := threadNetNS(t); got != want {
					return fmt.Errorf("thread netns %d, want %d", got, want)
				}
				return nil
			},
		},
		{
			name: "child processes inherit the namespace",
			path: target.Path(),
			fn: func() error {
				out, err := exec.Command("readlink", "/proc/self/ns/net").Output()
				if err != nil {
					return fmt.Errorf("readlink: %w", err)
				}
				if got, w := strings.TrimSpace(string(out)), fmt.Sprintf("net:[%d]", want); got != w {
					return fmt.Errorf("child netns %s, want %s", got, w)
				}
				return nil
			},
		},
		{
			name:   "fn error is returned unchanged",
			path:   target.Path(),
			fn:     func() error { return sentinel },
			wantIs: sentinel,
		},
		{
			name:    "missing path is named in the error",
			path:    "/var/run/netns/does-not-exist-netnsutil",
			fn:      func() error { t.Error("fn must not run"); return nil },
			wantErr: "/var/run/netns/does-not-exist-netnsutil",
		},
		{
			name:    "a regular file is refused",
			path:    regular,
			fn:      func() error { t.Error("fn must not run"); return nil },
			wantErr: regular,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			before := threadNetNS(t)

			err := netnsutil.Do(tc.path, tc.fn)
			switch {
			case tc.wantIs != nil:
				if !errors.Is(err, tc.wantIs) {
					t.Fatalf("Do = %v, want %v", err, tc.wantIs)
				}
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Do = %v, want an error naming %q", err, tc.wantErr)
				}
			default:
				if err != nil {
					t.Fatalf("Do: %v", err)
				}
			}
			if after := threadNetNS(t); after != before {
				t.Fatalf("caller's thread moved from netns %d to %d", before, after)
			}
		})
	}
}

// CheckNetNS tells a network namespace from everything a --netns or CNI_NETNS path might be
// by mistake, and says which it is. It needs no root: a process may inspect its own namespaces.
func TestCheckNetNS(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, want string // want "" means accepted
	}{
		{"/proc/self/ns/net", ""},
		{file, "a file, not a namespace"},
		{t.TempDir(), "a directory, not a namespace"},
		{"/proc/self/ns/mnt", "a mount namespace, not a network namespace"},
		{"/proc/self/ns/uts", "a uts namespace, not a network namespace"},
		{filepath.Join(t.TempDir(), "missing"), "no such file or directory"},
	}
	for _, tt := range tests {
		err := netnsutil.CheckNetNS(tt.path)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckNetNS(%s) = %v, want nil", tt.path, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("CheckNetNS(%s) = %v, want an error containing %q", tt.path, err, tt.want)
		}
	}
}
