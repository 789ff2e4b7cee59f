package stress

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// primaryConf is a flannel-style single-plugin .conf, which the installer turns into a list.
const primaryConf = `{
  "name": "cbr0",
  "cniVersion": "0.3.1",
  "type": "flannel",
  "delegate": {"hairpinMode": true, "isDefaultGateway": true, "generation": %d}
}
`

// installer is one `linkerd-cni install` process, in the node's network namespace, on a node laid
// out in a temporary directory.
type installer struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	done chan struct{}
}

func startInstaller(t *testing.T, node *nt.NS, root string) *installer {
	t.Helper()
	in := &installer{cmd: exec.Command(binary(t, "linkerd-cni"), "install", "--admin-addr", "127.0.0.1:9190"), done: make(chan struct{})}
	in.cmd.Env = []string{
		"CONTAINER_MOUNT_PREFIX=" + filepath.Join(root, "host"),
		"CONTAINER_CNI_BIN_DIR=" + filepath.Join(root, "image"),
		"SERVICE_ACCOUNT_PATH=" + filepath.Join(root, "sa"),
		"SKIP_TLS_VERIFY=true",
		"KUBERNETES_SERVICE_HOST=192.0.2.1", "KUBERNETES_SERVICE_PORT=443", "POD_NAMESPACE=linkerd-cni",
	}
	in.cmd.Stdout, in.cmd.Stderr = &in.out, &in.out
	if err := node.Do(in.cmd.Start); err != nil {
		t.Fatalf("start the installer: %v", err)
	}
	go func() { _ = in.cmd.Wait(); close(in.done) }()
	t.Cleanup(func() {
		_ = in.cmd.Process.Kill()
		<-in.done
	})
	return in
}

// ready asks the installer's /ready from inside the node. The connection is made on the thread
// inside the namespace and keeps it; an http.Client would dial from another goroutine, outside.
func ready(node *nt.NS) bool {
	var conn net.Conn
	if err := node.Do(func() error {
		var err error
		conn, err = net.DialTimeout("tcp", "127.0.0.1:9190", time.Second)
		return err
	}); err != nil {
		return false
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(conn, "GET /ready HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"); err != nil {
		return false
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// TestStressInstallerChurn restarts the installer again and again (SIGKILL or SIGTERM at a
// random moment) while the primary CNI rewrites its .conf. After the churn one more installer
// must become ready with linkerd-cni in the primary's latest config, and its uninstall must give
// back the primary's latest .conf byte for byte and nothing else.
func TestStressInstallerChurn(t *testing.T) {
	nt.RequireRoot(t)
	node := nt.NewNS(t)
	root := t.TempDir()
	netDir := filepath.Join(root, "host/etc/cni/net.d")
	for _, d := range []string{netDir, filepath.Join(root, "host/opt/cni/bin"), filepath.Join(root, "image"), filepath.Join(root, "sa")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite := func(path, content string) {
		t.Helper()
		tmp := path + ".tmp-primary"
		if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	mustWrite(filepath.Join(root, "image/linkerd-cni"), "plugin binary")
	mustWrite(filepath.Join(root, "sa/token"), "token")
	conf := filepath.Join(netDir, "10-flannel.conf")
	generation := 0
	rewrite := func() string {
		generation++
		c := fmt.Sprintf(primaryConf, generation)
		mustWrite(conf, c)
		return c
	}
	rewrite()

	kills, terms := 0, 0
	for range *churn {
		in := startInstaller(t, node, root)
		time.Sleep(rand.N(300 * time.Millisecond))
		if rand.N(2) == 0 {
			rewrite() // the primary restarts too, and writes its .conf again
		}
		sig := syscall.SIGKILL
		if rand.N(2) == 0 {
			sig, terms = syscall.SIGTERM, terms+1
		} else {
			kills++
		}
		_ = in.cmd.Process.Signal(sig)
		select {
		case <-in.done:
		case <-time.After(20 * time.Second):
			t.Fatalf("the installer did not exit after %v:\n%s", sig, in.out.String())
		}
	}
	latest := rewrite()

	in := startInstaller(t, node, root)
	deadline := time.Now().Add(20 * time.Second)
	for !ready(node) {
		if time.Now().After(deadline) {
			t.Fatalf("the last installer never became ready:\n%s", in.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	corrupt := 0
	list, err := os.ReadFile(filepath.Join(netDir, "10-flannel.conflist"))
	var parsed struct {
		Plugins []map[string]any `json:"plugins"`
	}
	if err != nil || json.Unmarshal(list, &parsed) != nil || len(parsed.Plugins) != 2 || parsed.Plugins[1]["type"] != "linkerd-cni" ||
		!strings.Contains(string(list), fmt.Sprintf(`"generation": %d`, generation)) {
		corrupt++
		t.Errorf("after the churn the list is not the latest .conf plus linkerd-cni (err %v):\n%s", err, list)
	}
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	<-in.done
	names, _ := os.ReadDir(netDir)
	got, _ := os.ReadFile(conf)
	if len(names) != 1 || string(got) != latest {
		corrupt++
		t.Errorf("after uninstall the net dir holds %v, .conf %q; want only the primary's latest .conf", names, got)
	}
	fmt.Printf("stress: %-26s %d restarts (%d SIGKILL, %d SIGTERM), %d .conf rewrites; corrupt end states: %d\n",
		"installer churn", *churn, kills, terms, generation, corrupt)
}
