package hygiene

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// TestPlainGoBuildRuns holds every command under cmd/ to what `go build`, `go install` and `go
// run` give a user: a plain build, without flags, tags or cgo, is a working binary. Each one's
// version answers (the plugins' CNI VERSION too), and the plain proxy-init writes the Linkerd
// chart's rules into a pod's namespace, and into one that a user namespace of its own owns (a pod
// with hostUsers: false).
func TestPlainGoBuildRuns(t *testing.T) {
	entries, err := os.ReadDir("../../cmd")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var cmds []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		cmds = append(cmds, e.Name())
		build := exec.Command("go", "build", "-o", dir, "./cmd/"+e.Name())
		build.Dir = "../.."
		build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build -o DIR ./cmd/%s: %v\n%s", e.Name(), err, out)
		}
	}
	if len(cmds) < 2 {
		t.Fatalf("cmd/ holds %v; want proxy-init and linkerd-cni at least", cmds)
	}
	for _, name := range cmds {
		bin := filepath.Join(dir, name)
		if out, err := runPlain(t, bin, nil, "version"); err != nil || !strings.HasPrefix(out, name+" ") {
			t.Errorf("%s version: %v, %q; want its name and build", name, err, out)
		}
		if !strings.HasPrefix(name, "linkerd-cni") {
			continue
		}
		if out, err := runPlain(t, bin, []string{"CNI_COMMAND=VERSION"}); err != nil || !strings.Contains(out, `"supportedVersions":[`) {
			t.Errorf("CNI_COMMAND=VERSION %s: %v, %q; want the CNI versions it supports", name, err, out)
		}
	}

	proxyInit := filepath.Join(dir, "proxy-init")
	for _, c := range []struct {
		pod   string
		newNS func(testing.TB) *nt.NS
		list  []string // lists our rules in the namespace
	}{
		{"a pod", nt.NewNS, []string{"iptables-nft-save", "-t", "nat"}},
		{"a pod with hostUsers: false", nt.NewUserNS, []string{"nft", "list", "table", "inet", "proxy_init"}},
	} {
		t.Run(c.pod, func(t *testing.T) {
			nt.RequireRoot(t, "the plain proxy-init writes into a namespace it creates")
			ns := c.newNS(t)
			chart := []string{"--incoming-proxy-port", "4143", "--outgoing-proxy-port", "4140", "--proxy-uid", "2102",
				"--inbound-ports-to-ignore", "4190,4191,4567,4568", "--outbound-ports-to-ignore", "4567,4568", "--netns", ns.Path()}
			if out, err := runPlain(t, proxyInit, nil, chart...); err != nil {
				t.Fatalf("proxy-init %s: %v\n%s", strings.Join(chart, " "), err, out)
			}
			if out, err := runPlain(t, proxyInit, nil, append([]string{"show"}, chart...)...); err != nil || !strings.Contains(out, "rules match the configuration") {
				t.Errorf("proxy-init show: %v\n%s", err, out)
			}
			out, err := nt.RunIn(t, ns, c.list[0], c.list[1:]...)
			if err != nil || !strings.Contains(out, "proxy-init/redirect-all-outgoing-to-proxy-port") || !strings.Contains(out, "2102") {
				t.Errorf("%s: %v; want the chart's rules:\n%s", strings.Join(c.list, " "), err, out)
			}
		})
	}
}

// runPlain runs bin with env added to ours and returns its standard output, or an error with its
// standard error.
func runPlain(t *testing.T, bin string, env []string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), errors.Join(err, errors.New(stderr.String()))
	}
	return stdout.String(), nil
}
