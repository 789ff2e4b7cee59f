package agent

import (
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
)

// The socket's directory becomes root-only and the socket owner-only; a stale socket (a killed
// agent's) is replaced; anything else at the path is refused, naming it.
func TestListen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "run")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.sock")
	stale, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	stale.SetUnlinkOnClose(false)
	stale.Close() // the file stays, as after a SIGKILL
	// Listening sends nothing to the API.
	client, err := kubeclient.New(&rest.Config{Host: "https://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(client, Options{NodeName: "n", Socket: path})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := a.listen()
	if err != nil {
		t.Fatalf("listen over a stale socket: %v", err)
	}
	for p, want := range map[string]fs.FileMode{dir: 0o700 | fs.ModeDir, path: 0o600 | fs.ModeSocket} {
		if fi, err := os.Lstat(p); err != nil || fi.Mode() != want {
			t.Errorf("%s: mode %v, %v; want %v", p, fi.Mode(), err, want)
		}
	}
	srv.close()
	if _, err := os.Lstat(path); !os.IsNotExist(err) {
		t.Errorf("the socket outlived the listener: %v", err)
	}

	if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := a.listen(); err == nil || !strings.Contains(err.Error(), "refusing to replace "+path+": it is not a socket (mode -rw-------); remove it") {
		t.Errorf("listen over a regular file = %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "x" {
		t.Error("the file was replaced")
	}
}
