package install

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kubemesh/proxy-init/test/cnitest"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

const kubeconfigName = "ZZZ-linkerd-cni-kubeconfig"

func TestInstallAndUninstall(t *testing.T) {
	tests := []struct {
		name      string
		files     map[string]string
		patched   string // the list that must carry linkerd-cni
		wantTypes []string
		gone      string // a file the install removes (a converted .conf)
	}{
		{
			name:      "calico conflist",
			files:     map[string]string{"10-calico.conflist": calicoConflist},
			patched:   "10-calico.conflist",
			wantTypes: []string{"calico", "portmap", "bandwidth", "linkerd-cni"},
		},
		{
			name:      "flannel conf becomes a conflist",
			files:     map[string]string{"10-flannel.conf": flannelConf},
			patched:   "10-flannel.conflist",
			wantTypes: []string{"flannel", "linkerd-cni"},
			gone:      "10-flannel.conf",
		},
		{
			// The runtimes read a .json as a single plugin, like a .conf, and 05- comes first.
			name: "a .json before the primary's list is converted too",
			files: map[string]string{
				"05-extra.json":      `{"cniVersion":"0.4.0","name":"extra","type":"bridge","bridge":"br-extra"}`,
				"10-calico.conflist": calicoConflist,
			},
			patched:   "05-extra.conflist",
			wantTypes: []string{"bridge", "linkerd-cni"},
			gone:      "05-extra.json",
		},
		{
			name: "every file is patched",
			files: map[string]string{
				"05-cilium.conflist": `{"cniVersion":"0.3.1","name":"cilium","plugins":[{"type":"cilium-cni","enable-debug":false}]}`,
				"10-flannel.conf":    flannelConf,
				"99-loopback.conf":   `{"cniVersion":"1.0.0","name":"lo","type":"loopback"}`,
			},
			patched:   "05-cilium.conflist",
			wantTypes: []string{"cilium-cni", "linkerd-cni"},
			gone:      "10-flannel.conf",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHost(t)
			for name, content := range tt.files {
				h.write(t, name, content)
			}
			netBefore := dirNames(t, h.netDir)
			binBefore := dirNames(t, h.binDir)
			r := h.start(t)
			r.waitReady(t)

			types, last := lastPlugin(t, h.read(t, tt.patched))
			if !slices.Equal(types, tt.wantTypes) {
				t.Errorf("%s plugin types = %v, want %v", tt.patched, types, tt.wantTypes)
			}
			if kc := last["kubernetes"].(map[string]any)["kubeconfig"]; kc != "/etc/cni/net.d/"+kubeconfigName {
				t.Errorf("kubernetes.kubeconfig = %v, want the node's path /etc/cni/net.d/%s", kc, kubeconfigName)
			}
			if ex, _ := last["kubernetes"].(map[string]any)["exclude-namespaces"].([]any); len(ex) != 1 || ex[0] != "linkerd-cni" {
				t.Errorf("kubernetes.exclude-namespaces = %v, want [linkerd-cni]", last["kubernetes"])
			}
			// Every config file carries exactly one entry, last.
			for _, name := range dirNames(t, h.netDir) {
				if isConfigName(name) && !hasLinkerdLast(h.read(t, name)) {
					t.Errorf("%s does not end with one linkerd-cni entry:\n%s", name, h.read(t, name))
				}
			}
			if tt.gone != "" {
				if _, err := os.Stat(filepath.Join(h.netDir, tt.gone)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s still exists after conversion (err %v)", tt.gone, err)
				}
			}
			// The plugin: same bytes, mode kept.
			bin := filepath.Join(h.binDir, "linkerd-cni")
			if got, err := os.ReadFile(bin); err != nil || !bytes.Equal(got, h.binary) {
				t.Errorf("the plugin was not copied intact (err %v)", err)
			}
			if fi, err := os.Stat(bin); err != nil || fi.Mode().Perm() != 0o755 {
				t.Errorf("the plugin's mode = %v (err %v), want 0755", fi.Mode(), err)
			}
			// The kubeconfig: 0600.
			if fi, err := os.Stat(filepath.Join(h.netDir, kubeconfigName)); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("kubeconfig mode = %v (err %v), want 0600", fi.Mode(), err)
			}

			if err := r.stop(t); err != nil {
				t.Fatalf("Run returned %v on cancel", err)
			}
			// Every byte as before; the kubeconfig, binary and temp files gone.
			if got := dirNames(t, h.netDir); !slices.Equal(got, netBefore) {
				t.Errorf("net dir after uninstall = %v, want %v", got, netBefore)
			}
			for name, content := range tt.files {
				if got := h.read(t, name); got != content {
					t.Errorf("%s not restored byte for byte:\n got %q\nwant %q", name, got, content)
				}
			}
			if got := dirNames(t, h.binDir); !slices.Equal(got, binBefore) {
				t.Errorf("bin dir after uninstall = %v, want %v", got, binBefore)
			}
		})
	}
}

func TestWaitsForPrimaryConfig(t *testing.T) {
	h := newHost(t)
	r := h.start(t)
	waitFor(t, 5*time.Second, "the kubeconfig", func() (bool, string) {
		_, err := os.Stat(filepath.Join(h.netDir, kubeconfigName))
		return err == nil, "no kubeconfig"
	})
	waitFor(t, 5*time.Second, "/ready to say it waits", func() (bool, string) {
		code, body := r.ready(t)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "waiting for the primary CNI"), fmt.Sprintf("%d %q", code, body)
	})
	time.Sleep(200 * time.Millisecond)
	if code, body := r.ready(t); code != http.StatusServiceUnavailable {
		t.Errorf("/ready before any CNI config = %d %q, want 503", code, body)
	}
	if names := dirNames(t, h.netDir); !slices.Equal(names, []string{kubeconfigName}) {
		t.Errorf("net dir holds %v; the installer must not create a config of its own", names)
	}
	h.replace(t, "10-calico.conflist", calicoConflist)
	took := waitFor(t, time.Second, "linkerd-cni in the new config", func() (bool, string) {
		d := h.read(t, "10-calico.conflist")
		return hasLinkerdLast(d), d
	})
	t.Logf("added %v after the primary's config appeared", took)
	r.waitReady(t)
}

// TestReapplyAfterPrimaryRewrites rewrites the primary's file in the ways
// CNI daemons do, and checks that linkerd-cni is back within a second, that
// the primary's new bytes are kept, and that each rewrite costs exactly one
// write of ours.
func TestReapplyAfterPrimaryRewrites(t *testing.T) {
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	r := h.start(t)
	r.waitReady(t)
	const name = "10-calico.conflist"
	if n := h.writeCount(name); n != 1 {
		t.Fatalf("%d writes of %s to install, want 1", n, name)
	}
	rewrites := []struct {
		how string
		do  func(content string)
	}{
		{"rename over (Calico, Cilium)", func(c string) { h.replace(t, name, c) }},
		{"truncate and write in place", func(c string) { h.write(t, name, c) }},
		{"delete then create", func(c string) {
			if err := os.Remove(filepath.Join(h.netDir, name)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			h.write(t, name, c)
		}},
	}
	for i, rw := range rewrites {
		t.Run(rw.how, func(t *testing.T) {
			before := h.writeCount(name)
			content := strings.Replace(calicoConflist, `"mtu": 1440`, `"mtu": `+string(rune('1'+i))+`400`, 1)
			rw.do(content)
			took := waitFor(t, time.Second, "linkerd-cni re-added", func() (bool, string) {
				d, err := os.ReadFile(filepath.Join(h.netDir, name))
				return err == nil && hasLinkerdLast(string(d)), string(d)
			})
			t.Logf("re-added in %v", took)
			got := h.read(t, name)
			back, _, err := removeEntries([]byte(got), "linkerd-cni")
			if err != nil || string(back) != content {
				t.Errorf("the primary's new bytes were not kept:\n%s", got)
			}
			// Let the echo of our own write arrive, then count.
			time.Sleep(300 * time.Millisecond)
			if n := h.writeCount(name) - before; n != 1 {
				t.Errorf("%d writes for one rewrite, want 1", n)
			}
			r.waitReady(t)
		})
	}
}

// TestNoRewriteLoop checks that the installer's own writes do not make it
// write again: nothing is written while nothing changes, and the file keeps
// its inode.
func TestNoRewriteLoop(t *testing.T) {
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	h.write(t, "10-flannel.conf", flannelConf)
	r := h.start(t)
	r.waitReady(t)
	ids := map[string]fileID{}
	for _, n := range []string{"10-calico.conflist", "10-flannel.conflist", kubeconfigName} {
		id, err := statID(filepath.Join(h.netDir, n))
		if err != nil {
			t.Fatal(err)
		}
		ids[n] = id
	}
	counts := map[string]int{}
	for n := range ids {
		counts[n] = h.writeCount(n)
	}
	// Other activity in the directory must not cause writes either.
	h.write(t, "unrelated.txt", "x")
	if err := os.Chmod(filepath.Join(h.netDir, "10-calico.conflist"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	for n, id := range ids {
		now, err := statID(filepath.Join(h.netDir, n))
		if err != nil || now != id {
			t.Errorf("%s was rewritten while nothing changed (%+v -> %+v, err %v)", n, id, now, err)
		}
		if c := h.writeCount(n); c != counts[n] {
			t.Errorf("%s: %d writes while idle, want 0", n, c-counts[n])
		}
	}
	for n, c := range counts {
		if c != 1 {
			t.Errorf("%s was written %d times to install, want 1", n, c)
		}
	}
}

func TestTokenRotation(t *testing.T) {
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	r := h.start(t)
	r.waitReady(t)
	kcPath := filepath.Join(h.netDir, kubeconfigName)
	checkToken := func(want string) {
		t.Helper()
		cfg, err := clientcmd.LoadFromFile(kcPath)
		if err != nil {
			t.Fatalf("load kubeconfig: %v", err)
		}
		if got := cfg.AuthInfos["linkerd-cni"].Token; got != want {
			t.Errorf("token = %q, want %q", got, want)
		}
		if fi, err := os.Stat(kcPath); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("kubeconfig mode = %v (err %v), want 0600", fi.Mode(), err)
		}
	}
	checkToken("token-1")
	conflist := h.read(t, "10-calico.conflist")
	for _, tok := range []string{"token-2", "token-3"} {
		h.projectSA(t, map[string]string{"token": tok, "ca.crt": testCA, "namespace": "linkerd-cni"})
		took := waitFor(t, time.Second, "the kubeconfig to carry "+tok, func() (bool, string) {
			b, _ := os.ReadFile(kcPath)
			return bytes.Contains(b, []byte(`"`+tok+`"`)), string(b)
		})
		t.Logf("kubeconfig rewritten %v after the ..data swap", took)
		checkToken(tok)
	}
	// The token never reaches the conflist, which does not change.
	if got := h.read(t, "10-calico.conflist"); got != conflist || strings.Contains(got, "token-") {
		t.Errorf("conflist changed on token rotation:\n%s", got)
	}
	r.waitReady(t)
}

func TestKubeconfig(t *testing.T) {
	tests := []struct {
		host, wantServer string
		skipTLS          bool
	}{
		{host: "10.96.0.1", wantServer: "https://10.96.0.1:443"},
		{host: "2001:db8::1", wantServer: "https://[2001:db8::1]:443"},
		{host: "[2001:db8::1]", wantServer: "https://[2001:db8::1]:443"},
		{host: "kubernetes.default.svc", wantServer: "https://kubernetes.default.svc:443", skipTLS: true},
	}
	for _, tt := range tests {
		t.Run(tt.host, func(t *testing.T) {
			h := newHost(t)
			h.cfg.ServiceHost = tt.host
			h.cfg.SkipTLSVerify = tt.skipTLS
			r := h.start(t)
			path := filepath.Join(h.netDir, kubeconfigName)
			waitFor(t, 5*time.Second, "the kubeconfig", func() (bool, string) {
				_, err := os.Stat(path)
				return err == nil, "missing"
			})
			fi, err := os.Stat(path)
			if err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("mode = %v (err %v), want 0600", fi.Mode(), err)
			}
			cfg, err := clientcmd.LoadFromFile(path)
			if err != nil {
				t.Fatalf("clientcmd cannot load it: %v", err)
			}
			if cfg.CurrentContext != "linkerd-cni-context" {
				t.Errorf("current-context = %q", cfg.CurrentContext)
			}
			ctx := cfg.Contexts["linkerd-cni-context"]
			if ctx == nil || ctx.Cluster != "local" || ctx.AuthInfo != "linkerd-cni" {
				t.Fatalf("context = %+v, want cluster local, user linkerd-cni", ctx)
			}
			cl := cfg.Clusters["local"]
			if cl.Server != tt.wantServer {
				t.Errorf("server = %q, want %q", cl.Server, tt.wantServer)
			}
			if tt.skipTLS {
				if !cl.InsecureSkipTLSVerify || len(cl.CertificateAuthorityData) != 0 {
					t.Errorf("skip-tls: %+v", cl)
				}
			} else if string(cl.CertificateAuthorityData) != testCA {
				t.Errorf("CA data = %q, want the service account's ca.crt", cl.CertificateAuthorityData)
			}
			if cfg.AuthInfos["linkerd-cni"].Token != "token-1" {
				t.Errorf("token = %q", cfg.AuthInfos["linkerd-cni"].Token)
			}
			// Built the way clients build it: the IPv6 host must parse.
			rc, err := clientcmd.NewDefaultClientConfig(*cfg, nil).ClientConfig()
			if err != nil || rc.Host != tt.wantServer {
				t.Errorf("rest config host = %v (err %v)", rc, err)
			}
			_ = r
		})
	}
}

// TestUninstallRestoresBytes covers removal when the file is unchanged
// since our write, when the primary rewrote it after our write, and when
// it carried a stale entry from an earlier install (Linkerd's upgrade bug
// left revoked tokens behind that way).
func TestUninstallRestoresBytes(t *testing.T) {
	const stale = `{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"calico","mtu":1440},` +
		`{"type":"linkerd-cni","kubernetes":{"kubeconfig":"/etc/cni/net.d/ZZZ-linkerd-cni-kubeconfig"},"token":"revoked"},{"type":"portmap"}]}`
	const staleWithout = `{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"calico","mtu":1440},{"type":"portmap"}]}`
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	h.write(t, "20-stale.conflist", stale)
	oddBytes := "{ \"plugins\" : [\t{\"type\":\"bridge\" , \"n\":1E+2}\n ] , \"name\":\"odd\" ,\"cniVersion\":\"0.4.0\"}\n\n"
	h.write(t, "30-odd.conflist", oddBytes)
	r := h.start(t)
	r.waitReady(t)
	if strings.Contains(h.read(t, "20-stale.conflist"), "revoked") {
		t.Errorf("the stale entry survived the install:\n%s", h.read(t, "20-stale.conflist"))
	}
	// The primary rewrites one file after our write; removal must keep its
	// new bytes.
	rewritten := strings.Replace(calicoConflist, `"mtu": 1440`, `"mtu": 8950`, 1)
	h.replace(t, "10-calico.conflist", rewritten)
	waitFor(t, time.Second, "re-add", func() (bool, string) {
		d := h.read(t, "10-calico.conflist")
		return hasLinkerdLast(d) && strings.Contains(d, "8950"), d
	})
	if err := r.stop(t); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	for name, want := range map[string]string{
		"10-calico.conflist": rewritten,
		"20-stale.conflist":  staleWithout,
		"30-odd.conflist":    oddBytes,
	} {
		if got := h.read(t, name); got != want {
			t.Errorf("%s after uninstall:\n got %q\nwant %q", name, got, want)
		}
	}
}

func TestMalformedConflistLeftUntouched(t *testing.T) {
	h := newHost(t)
	const bad = `{"cniVersion":"0.3.1","name":"broken","plugins":[{"type":"calico"},]}`
	h.write(t, "05-broken.conflist", bad)
	h.write(t, "10-calico.conflist", calicoConflist)
	badPath := filepath.Join(h.netDir, "05-broken.conflist")
	before, _ := statID(badPath)
	r := h.start(t)
	waitFor(t, 5*time.Second, "the good file to be patched", func() (bool, string) {
		d := h.read(t, "10-calico.conflist")
		return hasLinkerdLast(d), d
	})
	time.Sleep(200 * time.Millisecond)
	code, body := r.ready(t)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, badPath) || !strings.Contains(body, "invalid JSON") {
		t.Errorf("/ready = %d %q; want 503 naming %s and the problem", code, body, badPath)
	}
	if logs := r.logs.String(); !strings.Contains(logs, badPath) || strings.Count(logs, "05-broken.conflist: invalid JSON") != 1 {
		t.Errorf("the problem should be logged once, naming the file; logs:\n%s", logs)
	}
	if got := h.read(t, "05-broken.conflist"); got != bad {
		t.Errorf("malformed file changed: %q", got)
	}
	if now, _ := statID(badPath); now != before {
		t.Errorf("malformed file was rewritten (%+v -> %+v)", before, now)
	}
	// Fixing it makes the installer patch it and become ready.
	fixed := strings.Replace(bad, "},]", "}]", 1)
	h.replace(t, "05-broken.conflist", fixed)
	r.waitReady(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := h.read(t, "05-broken.conflist"); got != fixed {
		t.Errorf("fixed file not restored: %q", got)
	}
}

// A config left unparsable by someone after the installer added its entry still holds that
// entry: uninstall says it could not remove it (a file that never named linkerd-cni is only a
// warning: TestSIGTERMRemovesEverything).
func TestUninstallReportsABrokenFileOfOurs(t *testing.T) {
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	r := h.start(t)
	r.waitReady(t)
	broken := strings.Replace(h.read(t, "10-calico.conflist"), `"plugins": [`, `"plugins": [,`, 1)
	h.replace(t, "10-calico.conflist", broken)
	err := r.stop(t)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(h.netDir, "10-calico.conflist")) || !strings.Contains(err.Error(), "left untouched") {
		t.Errorf("uninstall = %v, want an error naming the file it could not clean", err)
	}
}

func TestMissingCredentials(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"no token", map[string]string{"ca.crt": testCA}, "token"},
		{"empty token", map[string]string{"token": "\n", "ca.crt": testCA}, "is empty"},
		{"no CA", map[string]string{"token": "t"}, "ca.crt does not exist"},
		{"CA not PEM", map[string]string{"token": "t", "ca.crt": "hello"}, "holds no PEM certificate"},
		{"no service account volume", nil, "automountServiceAccountToken"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHost(t)
			h.write(t, "10-calico.conflist", calicoConflist)
			if err := os.RemoveAll(h.saDir); err != nil {
				t.Fatal(err)
			}
			if err := os.MkdirAll(h.saDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if tt.files != nil {
				h.projectSA(t, tt.files)
			} else if err := os.Remove(h.saDir); err != nil {
				t.Fatal(err)
			}
			h.cfg.AdminAddr = "-"
			ctx, cancel := contextWithTimeout(5 * time.Second)
			defer cancel()
			err := Run(ctx, h.cfg, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), h.saDir) {
				t.Fatalf("Run error = %v, want one naming %s and %q", err, h.saDir, tt.want)
			}
			if ctx.Err() != nil {
				t.Fatal("Run waited instead of failing at once")
			}
			if got := h.read(t, "10-calico.conflist"); got != calicoConflist {
				t.Errorf("config changed although the installer failed")
			}
			if _, err := os.Stat(filepath.Join(h.netDir, kubeconfigName)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a kubeconfig was written without credentials")
			}
		})
	}
}

// TestWatchLossIsFatal removes the watched net dir: the installer must
// exit with an error rather than keep running blind.
func TestWatchLossIsFatal(t *testing.T) {
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	r := h.start(t)
	r.waitReady(t)
	if err := os.RemoveAll(h.netDir); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.done:
		r.done <- err
		if err == nil || !strings.Contains(err.Error(), h.netDir) {
			t.Fatalf("Run = %v, want an error naming %s", err, h.netDir)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the installer kept running after its watched directory vanished")
	}
}

// TestBinaryRestoredWhenRemoved: the plugin and the kubeconfig removed from the node are put back
// within a second, the watch seeing it.
func TestBinaryRestoredWhenRemoved(t *testing.T) {
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	r := h.start(t)
	r.waitReady(t)
	bin := filepath.Join(h.binDir, "linkerd-cni")
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "the plugin to be copied again", func() (bool, string) {
		b, err := os.ReadFile(bin)
		return err == nil && bytes.Equal(b, h.binary), "missing"
	})
	// Kubeconfig too.
	if err := os.Remove(filepath.Join(h.netDir, kubeconfigName)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "the kubeconfig to be written again", func() (bool, string) {
		_, err := os.Stat(filepath.Join(h.netDir, kubeconfigName))
		return err == nil, "missing"
	})
}

// TestUpgradeFromCompanionLayout: over an older installation (an upgrade) whose plugin ran a
// companion binary, the installer writes the kubeconfig, then replaces the plugin by a rename,
// then removes the stale companion (and says so), before it writes any config; it removes the
// plugin, then the kubeconfig, after every config. At no moment does the node hold a plugin
// without its kubeconfig.
func TestUpgradeFromCompanionLayout(t *testing.T) {
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	plugin, companion := filepath.Join(h.binDir, "linkerd-cni"), filepath.Join(h.binDir, "linkerd-cni-api")
	kubeconfig := filepath.Join(h.netDir, kubeconfigName)
	for _, p := range []string{plugin, companion} {
		if err := os.WriteFile(p, []byte("the previous release"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	oldPlugin, err := os.Stat(plugin)
	if err != nil {
		t.Fatal(err)
	}
	r := h.start(t)
	r.waitReady(t)
	if b, err := os.ReadFile(plugin); err != nil || !bytes.Equal(b, h.binary) {
		t.Errorf("%s not replaced (err %v)", plugin, err)
	}
	if fi, err := os.Stat(plugin); err == nil && os.SameFile(fi, oldPlugin) {
		t.Error("the plugin was rewritten in place, not replaced by a rename (a runtime running it would see a mix)")
	}
	if _, err := os.Stat(companion); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the stale companion is still on the node (err %v)", err)
	}
	if want := `msg="removed the companion binary of an older linkerd-cni: the plugin reads the API itself" path=` + companion; !strings.Contains(r.logs.String(), want) {
		t.Errorf("the log lacks %s:\n%s", want, r.logs.String())
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	h.mu.Lock()
	order := slices.Clone(h.order)
	h.mu.Unlock()
	ours := slices.DeleteFunc(slices.Clone(order), func(p string) bool { return p != plugin && p != companion && p != kubeconfig })
	if want := []string{kubeconfig, plugin, companion, plugin, kubeconfig}; !slices.Equal(ours, want) {
		t.Errorf("kubeconfig and binaries written and removed in the order %v, want %v", ours, want)
	}
	if len(order) < 3 || !slices.Equal(order[:3], []string{kubeconfig, plugin, companion}) {
		t.Errorf("writes in order %v: want the kubeconfig, the plugin, the companion's removal first", order)
	}
	for _, p := range []string{plugin, kubeconfig} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after uninstall (err %v)", p, err)
		}
	}
}

// withPluginLog starts an installer whose network config sets log_file, on a host where that file
// holds existing (content unless empty) and the streamed lines go to out; maxSize is the rotation
// size (0: the default). appendLog writes as the plugin does: a fresh O_APPEND open per call.
func withPluginLog(t *testing.T, existing string, maxSize int64) (logPath string, out *cnitest.SyncBuffer, appendLog func(string)) {
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	logDir := filepath.Join(h.root, "host/var/log/linkerd-cni")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		t.Fatal(err)
	}
	logPath = filepath.Join(logDir, "plugin.log")
	if existing != "" {
		if err := os.WriteFile(logPath, []byte(existing), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	h.cfg.NetworkConfig = strings.Replace(DefaultNetworkConfig, `"log_level":"info",`,
		`"log_level":"info","log_file":"/var/log/linkerd-cni/plugin.log",`, 1)
	h.cfg.PluginLogMaxSize = maxSize
	out = &cnitest.SyncBuffer{}
	h.cfg.PluginLogOutput = out
	h.start(t).waitReady(t)
	appendLog = func(s string) {
		f, err := os.OpenFile(logPath, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o640)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(s)
		f.Close()
	}
	return logPath, out, appendLog
}

func TestPluginLogStreaming(t *testing.T) {
	logPath, out, appendLog := withPluginLog(t, "old line from before the installer started\n", 0)
	time.Sleep(2 * logPollInterval)
	appendLog("ADD pod default/a\npartial")
	waitFor(t, 2*time.Second, "the plugin's line on stdout", func() (bool, string) {
		return strings.Contains(out.String(), "ADD pod default/a\n"), out.String()
	})
	appendLog(" line completed\n")
	waitFor(t, 2*time.Second, "the completed line", func() (bool, string) {
		return strings.Contains(out.String(), "partial line completed\n"), out.String()
	})
	// Rotated: a new file.
	if err := os.Rename(logPath, logPath+".1"); err != nil {
		t.Fatal(err)
	}
	appendLog("after rotation\n")
	waitFor(t, 2*time.Second, "a line of the new file", func() (bool, string) {
		return strings.Contains(out.String(), "after rotation\n"), out.String()
	})
	if strings.Contains(out.String(), "old line") {
		t.Errorf("lines from before the start were replayed:\n%s", out.String())
	}
}

// TestPluginLogRotation: once log_file has reached its size limit and been streamed, the
// installer renames it to log_file.1, and the next plugin call's lines, in a new file, are
// streamed too. The node keeps at most one old generation.
func TestPluginLogRotation(t *testing.T) {
	logPath, out, appendLog := withPluginLog(t, "", 100)
	// One write, so the file cannot be rotated half-way through these lines.
	var first strings.Builder
	for i := range 5 {
		fmt.Fprintf(&first, "ADD pod default/p%d: rules written\n", i)
	}
	appendLog(first.String())
	waitFor(t, 3*time.Second, "the full file streamed and rotated to plugin.log.1", func() (bool, string) {
		old, _ := os.ReadFile(logPath + ".1")
		_, err := os.Stat(logPath)
		return strings.Contains(out.String(), first.String()) && string(old) == first.String() && errors.Is(err, fs.ErrNotExist),
			fmt.Sprintf("streamed:\n%s\nplugin.log.1:\n%s\nplugin.log: %v", out.String(), old, err)
	})
	appendLog("ADD pod default/next: after rotation\n")
	waitFor(t, 3*time.Second, "a line of the new file", func() (bool, string) {
		return strings.HasSuffix(out.String(), first.String()+"ADD pod default/next: after rotation\n"), out.String()
	})
	// A second rotation replaces plugin.log.1 rather than piling up generations.
	appendLog(strings.Repeat("ADD pod default/more: filling the second generation\n", 4))
	waitFor(t, 3*time.Second, "plugin.log.1 replaced by the second file", func() (bool, string) {
		old, _ := os.ReadFile(logPath + ".1")
		return strings.HasPrefix(string(old), "ADD pod default/next"), string(old)
	})
	if matches, _ := filepath.Glob(logPath + "*"); len(matches) > 2 {
		t.Errorf("more than one old generation kept: %v", matches)
	}
}

// TestConfRewrittenAfterConversion: flannel writes its .conf again on restart; the installer
// converts it again over its own .conflist, also when a crashed installer left that .conflist
// behind, but never over a .conflist that is not its conversion.
func TestConfRewrittenAfterConversion(t *testing.T) {
	t.Run("while running", func(t *testing.T) {
		h := newHost(t)
		h.write(t, "10-flannel.conf", flannelConf)
		r := h.start(t)
		r.waitReady(t)
		rewritten := strings.Replace(flannelConf, `"hairpinMode": true`, `"hairpinMode": false`, 1)
		h.write(t, "10-flannel.conf", rewritten)
		waitFor(t, time.Second, "the new .conf converted again", func() (bool, string) {
			_, err := os.Stat(filepath.Join(h.netDir, "10-flannel.conf"))
			d, _ := os.ReadFile(filepath.Join(h.netDir, "10-flannel.conflist"))
			return errors.Is(err, os.ErrNotExist) && hasLinkerdLast(string(d)) && strings.Contains(string(d), `"hairpinMode": false`), string(d)
		})
		r.waitReady(t)
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if got := dirNames(t, h.netDir); !slices.Equal(got, []string{"10-flannel.conf"}) || h.read(t, "10-flannel.conf") != rewritten {
			t.Errorf("after uninstall: %v, .conf %q", got, h.read(t, "10-flannel.conf"))
		}
	})
	t.Run("after a crash", func(t *testing.T) {
		h := newHost(t)
		left, err := convertConf([]byte(flannelConf), "linkerd-cni", []byte(`{"type":"linkerd-cni","old":true}`), "10-flannel")
		if err != nil {
			t.Fatal(err)
		}
		h.write(t, "10-flannel.conflist", string(left))
		h.write(t, "10-flannel.conf", flannelConf)
		r := h.start(t)
		r.waitReady(t)
		if got := dirNames(t, h.netDir); !slices.Equal(got, []string{"10-flannel.conflist", kubeconfigName}) {
			t.Errorf("net dir = %v", got)
		}
		if d := h.read(t, "10-flannel.conflist"); strings.Contains(d, `"old"`) || !hasLinkerdLast(d) {
			t.Errorf("stale conversion not replaced:\n%s", d)
		}
	})
	t.Run("after a crash, with the .conf rewritten meanwhile", func(t *testing.T) {
		// The installer converted the .conf, was killed (nothing restored), and the primary CNI
		// then wrote its .conf anew with other content. That used to leave the installer unready
		// beside a stale .conflist, which runtimes read after the .conf.
		h := newHost(t)
		left, err := convertConf([]byte(flannelConf), "linkerd-cni", []byte(`{"type":"linkerd-cni","old":true}`), "10-flannel")
		if err != nil {
			t.Fatal(err)
		}
		h.write(t, "10-flannel.conflist", string(left))
		rewritten := strings.Replace(flannelConf, `"hairpinMode": true`, `"hairpinMode": false`, 1)
		h.write(t, "10-flannel.conf", rewritten)
		r := h.start(t)
		r.waitReady(t)
		d := h.read(t, "10-flannel.conflist")
		if strings.Contains(d, `"old"`) || !hasLinkerdLast(d) || !strings.Contains(d, `"hairpinMode": false`) {
			t.Errorf("the .conflist is not a conversion of the rewritten .conf:\n%s", d)
		}
		if err := r.stop(t); err != nil {
			t.Fatal(err)
		}
		if got := dirNames(t, h.netDir); !slices.Equal(got, []string{"10-flannel.conf"}) || h.read(t, "10-flannel.conf") != rewritten {
			t.Errorf("after uninstall: %v, .conf %q", got, h.read(t, "10-flannel.conf"))
		}
	})
	t.Run("a foreign list of the same name", func(t *testing.T) {
		h := newHost(t)
		const foreign = `{"cniVersion":"0.4.0","name":"other","plugins":[{"type":"ptp"},{"type":"portmap"}]}`
		h.write(t, "10-flannel.conflist", foreign)
		h.write(t, "10-flannel.conf", flannelConf)
		r := h.start(t)
		waitFor(t, 5*time.Second, "the clash to be reported", func() (bool, string) {
			code, body := r.ready(t)
			return code == http.StatusServiceUnavailable && strings.Contains(body, "10-flannel.conflist: that file already exists"), body
		})
		if h.read(t, "10-flannel.conf") != flannelConf {
			t.Error("the .conf was changed")
		}
		if d := h.read(t, "10-flannel.conflist"); !hasLinkerdLast(d) {
			t.Errorf("the foreign list itself should still be patched:\n%s", d)
		}
	})
}

// A network config the plugin would refuse is installed nowhere: with it in the conflist every
// ADD on the node fails, unmeshed pods' included. The installer stays up, unready, and says why,
// naming the key and the value.
func TestInvalidEntryIsNotInstalled(t *testing.T) {
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	h.cfg.NetworkConfig = strings.Replace(DefaultNetworkConfig, `"incoming-proxy-port":4143`, `"incoming-proxy-port":99999`, 1)
	if h.cfg.NetworkConfig == DefaultNetworkConfig {
		t.Fatal("the default config has no incoming-proxy-port to break")
	}
	r := h.start(t)
	const why = `linkerd.incoming-proxy-port "99999": port is outside 1-65535`
	waitFor(t, 5*time.Second, "/ready to refuse, naming the key and value", func() (bool, string) {
		code, body := r.ready(t)
		return code == http.StatusServiceUnavailable && strings.Contains(body, why), fmt.Sprintf("%d %q", code, body)
	})
	time.Sleep(100 * time.Millisecond)
	if d := h.read(t, "10-calico.conflist"); d != calicoConflist {
		t.Errorf("the conflist was changed:\n%s", d)
	}
	if logs := r.logs.String(); !strings.Contains(logs, `linkerd.incoming-proxy-port \"99999\": port is outside 1-65535`) || !strings.Contains(logs, "level=ERROR") {
		t.Errorf("no error log line naming the problem:\n%s", logs)
	}
}

// A list with no plugin to chain after (the primary has not filled it yet) is left alone and
// keeps the installer unready: linkerd-cni alone in a list fails every ADD.
func TestEmptyPluginListIsNotReady(t *testing.T) {
	h := newHost(t)
	const empty = `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[]}`
	h.write(t, "10-calico.conflist", empty)
	r := h.start(t)
	waitFor(t, 5*time.Second, "/ready to say the list has no plugin", func() (bool, string) {
		code, body := r.ready(t)
		return code == http.StatusServiceUnavailable && strings.Contains(body, "has no plugin for linkerd-cni to chain after"), fmt.Sprintf("%d %q", code, body)
	})
	if d := h.read(t, "10-calico.conflist"); d != empty {
		t.Errorf("the empty list was changed:\n%s", d)
	}
	h.replace(t, "10-calico.conflist", calicoConflist)
	r.waitReady(t)
}

// A failed write is logged, not only reported by /ready: a conflist that is a mount point (some
// distributions bind-mount it) cannot be replaced by rename, which fails with EBUSY.
func TestWriteErrorIsLogged(t *testing.T) {
	netnstest.RequireRoot(t, "bind-mounts a file over the conflist")
	h := newHost(t)
	h.write(t, "10-calico.conflist", calicoConflist)
	conflist := filepath.Join(h.netDir, "10-calico.conflist")
	if err := unix.Mount(conflist, conflist, "", unix.MS_BIND, ""); err != nil {
		t.Fatalf("bind-mount the conflist over itself: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(conflist, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", conflist, err)
		}
	})
	r := h.start(t)
	waitFor(t, 5*time.Second, "the write error in the log", func() (bool, string) {
		logs := r.logs.String()
		return strings.Contains(logs, "linkerd-cni is not in every CNI config") && strings.Contains(logs, "device or resource busy"), logs
	})
	if code, _ := r.ready(t); code != http.StatusServiceUnavailable {
		t.Errorf("/ready = %d with a failing write", code)
	}
}

// TestOversizedConfigLeftAlone: a file over MaxConfigSize (2 MiB here) in the net dir is never
// read whole: /ready names it and its size, it is logged once and left byte for byte, and the
// other files get the entry; uninstall leaves it alone too.
func TestOversizedConfigLeftAlone(t *testing.T) {
	h := newHost(t)
	big := `{"cniVersion":"0.4.0","name":"big","plugins":[{"type":"bridge","pad":"` + strings.Repeat("x", 2<<20) + `"}]}`
	h.write(t, "05-big.conflist", big)
	h.write(t, "10-calico.conflist", calicoConflist)
	bigPath := filepath.Join(h.netDir, "05-big.conflist")
	before, _ := statID(bigPath)
	r := h.start(t)
	waitFor(t, 5*time.Second, "the good file to be patched", func() (bool, string) {
		d := h.read(t, "10-calico.conflist")
		return hasLinkerdLast(d), d
	})
	want := fmt.Sprintf("%s is %d bytes, over the 1048576-byte (1 MiB) bound on a CNI config file: not read, left untouched", bigPath, len(big))
	waitFor(t, 5*time.Second, "/ready to name the big file", func() (bool, string) {
		code, body := r.ready(t)
		return code == http.StatusServiceUnavailable && strings.Contains(body, want), fmt.Sprintf("%d %s", code, body)
	})
	if n := strings.Count(r.logs.String(), "over the 1048576-byte (1 MiB) bound"); n != 1 {
		t.Errorf("the big file was logged %d times, want once", n)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	if now, _ := statID(bigPath); now != before || h.read(t, "05-big.conflist") != big {
		t.Errorf("the big file was rewritten (%+v -> %+v)", before, now)
	}
	if hasLinkerdLast(h.read(t, "10-calico.conflist")) {
		t.Error("the entry is still in 10-calico.conflist after uninstall")
	}
}

// TestReadConfigIsBounded: readConfig reads a regular file up to MaxConfigSize and refuses more,
// a FIFO without blocking, and a symbolic link.
func TestReadConfigIsBounded(t *testing.T) {
	dir := t.TempDir()
	at := func(name string) string { return filepath.Join(dir, name) }
	if err := os.WriteFile(at("max"), bytes.Repeat([]byte("a"), MaxConfigSize), 0o644); err != nil {
		t.Fatal(err)
	}
	if data, err := readConfig(at("max")); err != nil || len(data) != MaxConfigSize {
		t.Errorf("a file of exactly 1 MiB: %d bytes, %v", len(data), err)
	}
	if err := os.WriteFile(at("over"), bytes.Repeat([]byte("a"), MaxConfigSize+1), 0o644); err != nil {
		t.Fatal(err)
	}
	var big *tooBigError
	if _, err := readConfig(at("over")); !errors.As(err, &big) || big.size != MaxConfigSize+1 {
		t.Errorf("a file of 1 MiB + 1: %v, want a tooBigError of its size", err)
	}
	if err := unix.Mkfifo(at("fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readConfig(at("fifo")); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a FIFO: %v, want a refusal", err)
	}
	if err := os.Symlink(at("max"), at("link")); err != nil {
		t.Fatal(err)
	}
	if _, err := readConfig(at("link")); !errors.Is(err, unix.ELOOP) {
		t.Errorf("a symbolic link: %v, want ELOOP", err)
	}
}
