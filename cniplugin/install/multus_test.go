package install

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kubemesh/proxy-init/cniplugin"
)

// copyTestdata puts the files of testdata/multus/dir into the host's net dir, Multus's with the
// mode Multus gives them (0600).
func copyTestdata(t *testing.T, h *host, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join("testdata/multus", dir))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{}
	for _, e := range ents {
		b, err := os.ReadFile(filepath.Join("testdata/multus", dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(e.Name(), "00-multus") {
			mode = 0o600
		}
		if err := os.WriteFile(filepath.Join(h.netDir, e.Name()), b, mode); err != nil {
			t.Fatal(err)
		}
		files[e.Name()] = string(b)
	}
	return files
}

// runsPerPod counts how many times one pod's ADD runs linkerd-cni: in the chain of the config
// the runtime uses (the first by name), and in the default network Multus runs from it (the thin
// plugin's delegates, or the file the thick plugin's clusterNetwork names).
func runsPerPod(t *testing.T, h *host) int {
	t.Helper()
	var first string
	for _, name := range dirNames(t, h.netDir) {
		if isConfigName(name) {
			first = name
			break
		}
	}
	count := func(conf map[string]any) int {
		n := 0
		plugins, _ := conf["plugins"].([]any)
		if plugins == nil {
			plugins = []any{conf}
		}
		for _, p := range plugins {
			if p.(map[string]any)["type"] == "linkerd-cni" {
				n++
			}
		}
		return n
	}
	var top map[string]any
	if err := json.Unmarshal([]byte(h.read(t, first)), &top); err != nil {
		t.Fatalf("%s: %v", first, err)
	}
	n := count(top)
	plugins, _ := top["plugins"].([]any)
	if plugins == nil {
		plugins = []any{top}
	}
	for _, p := range plugins {
		m := p.(map[string]any)
		switch m["type"] {
		case "multus":
			for _, d := range m["delegates"].([]any) {
				n += count(d.(map[string]any))
			}
		case "multus-shim":
			var primary map[string]any
			if err := json.Unmarshal([]byte(h.read(t, filepath.Base(m["clusterNetwork"].(string)))), &primary); err != nil {
				t.Fatal(err)
			}
			n += count(primary)
		}
	}
	return n
}

// TestMultus installs beside Multus's own configs, as Multus writes them (testdata/multus): the
// plugin runs once per pod, in the default network Multus runs, not again after Multus; Multus's
// files keep their names and modes; uninstall restores every byte.
func TestMultus(t *testing.T) {
	for _, c := range []struct {
		dir     string
		multus  string // Multus's file, kept under its name
		primary string // the default network's file, chained
		types   []string
	}{
		{"thin-0.3.1", "00-multus.conf", "10-flannel.conflist", []string{"flannel", "portmap", "linkerd-cni"}},
		{"thin-1.0.0", "00-multus.conflist", "10-calico.conflist", []string{"calico", "bandwidth", "portmap", "linkerd-cni"}},
		{"thick", "00-multus.conf", "10-flannel.conflist", []string{"flannel", "portmap", "linkerd-cni"}},
	} {
		t.Run(c.dir, func(t *testing.T) {
			h := newHost(t)
			files := copyTestdata(t, h, c.dir)
			netBefore := dirNames(t, h.netDir)
			r := h.start(t)
			r.waitReady(t)
			if got := dirNames(t, h.netDir); !slices.Equal(got, append(slices.Clone(netBefore), kubeconfigName)) {
				t.Errorf("net dir %v: Multus's file must keep its name", got)
			}
			if types, _ := lastPlugin(t, h.read(t, c.primary)); !slices.Equal(types, c.types) {
				t.Errorf("%s plugins %v, want %v", c.primary, types, c.types)
			}
			if n := runsPerPod(t, h); n != 1 {
				t.Errorf("linkerd-cni runs %d times per pod, want once:\n%s", n, h.read(t, c.multus))
			}
			// --node-taint sees the plugin in place too (it reads the files again).
			in, err := newInstaller(h.cfg.withDefaults(), nil)
			if err != nil {
				t.Fatal(err)
			}
			if !in.syncAll() {
				t.Fatal("a second sync found work to do")
			}
			if ok, why := in.pluginInPlace(); !ok {
				t.Errorf("the startup taint would stay: %s", why)
			}
			if fi, err := os.Stat(filepath.Join(h.netDir, c.multus)); err != nil || fi.Mode().Perm() != 0o600 {
				t.Errorf("%s mode %v (%v), want Multus's 0600", c.multus, fi.Mode(), err)
			}
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}
			if got := dirNames(t, h.netDir); !slices.Equal(got, netBefore) {
				t.Errorf("net dir after uninstall %v, want %v", got, netBefore)
			}
			for name, want := range files {
				if got := h.read(t, name); got != want {
					t.Errorf("%s not restored:\n got %q\nwant %q", name, got, want)
				}
			}
		})
	}
}

// Multus's thin plugin remakes its config from the default network's file (on a restart, or
// with --cleanup-config-on-exit when the file changes), copying it into its delegates, linkerd-cni
// included now: still once per pod, not once in the copy and once after Multus.
func TestMultusRemakesItsConfig(t *testing.T) {
	h := newHost(t)
	copyTestdata(t, h, "thin-0.3.1")
	r := h.start(t)
	r.waitReady(t)
	// What thin_entrypoint does: the master's JSON, re-encoded (encoding/json: keys sorted,
	// compact), in place of the delegate.
	var master any
	if err := json.Unmarshal([]byte(h.read(t, "10-flannel.conflist")), &master); err != nil {
		t.Fatal(err)
	}
	copied, _ := json.Marshal(master)
	orig := readTestdata(t, "thin-0.3.1/00-multus.conf")
	var first map[string]any
	if err := json.Unmarshal([]byte(orig), &first); err != nil {
		t.Fatal(err)
	}
	old, _ := json.Marshal(first["delegates"].([]any)[0])
	remade := strings.Replace(orig, string(old), string(copied), 1)
	if remade == orig || !strings.Contains(remade, "linkerd-cni") {
		t.Fatal("test setup: the delegate was not replaced")
	}
	tmp := filepath.Join(h.netDir, "00-multus.conf.new") // Multus writes a temporary file and renames it
	if err := os.WriteFile(tmp, []byte(remade), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(h.netDir, "00-multus.conf")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // the installer's debounce and sync
	r.waitReady(t)
	if n := runsPerPod(t, h); n != 1 {
		t.Errorf("linkerd-cni runs %d times per pod after Multus remade its config, want once; net dir %v", n, dirNames(t, h.netDir))
	}
}

// Where an earlier install chained linkerd-cni after Multus (Linkerd's installer does), the entry
// moves into the delegates: once per pod again. Uninstall removes it from both.
func TestMultusEntryAfterMultusMoves(t *testing.T) {
	h := newHost(t)
	copyTestdata(t, h, "thin-1.0.0")
	doubled := strings.Replace(h.read(t, "00-multus.conflist"), "\n    }]\n}", "\n    }, {\"type\": \"linkerd-cni\", \"old\": true}]\n}", 1)
	if !strings.Contains(doubled, `"old": true`) {
		t.Fatal("test setup: no old entry")
	}
	h.write(t, "00-multus.conflist", doubled)
	r := h.start(t)
	r.waitReady(t)
	if n := runsPerPod(t, h); n != 1 || strings.Contains(h.read(t, "00-multus.conflist"), `"old"`) {
		t.Errorf("linkerd-cni runs %d times per pod, want once:\n%s", n, h.read(t, "00-multus.conflist"))
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := h.read(t, "00-multus.conflist"); strings.Contains(got, "linkerd-cni") {
		t.Errorf("an entry survived uninstall:\n%s", got)
	}
}

// A thick Multus whose default network linkerd-cni cannot be chained into from here is left
// alone, and the installer is not ready and says what to do instead: a single-plugin .conf
// (OVN-Kubernetes writes 10-ovn-kubernetes.conf), which converting would rename under Multus, or
// a file in another directory (OpenShift's Multus runs /run/multus/cni/net.d/10-ovn-kubernetes.conf).
func TestMultusPrimaryOutOfReach(t *testing.T) {
	const ovn = `{"cniVersion":"0.4.0","name":"ovn-kubernetes","type":"ovn-k8s-cni-overlay","ipam":{},"dns":{}}`
	for _, c := range []struct {
		name, clusterNetwork, want string
	}{
		{"single-plugin conf", "/host/etc/cni/net.d/10-ovn-kubernetes.conf", "/10-ovn-kubernetes.conf is the default network Multus runs"},
		{"another directory", "/host/run/multus/cni/net.d/10-ovn-kubernetes.conf", "default network that Multus (00-multus.conf) runs, /host/run/multus/cni/net.d/10-ovn-kubernetes.conf, is not in /etc/cni/net.d"},
	} {
		t.Run(c.name, func(t *testing.T) {
			h := newHost(t)
			shim := strings.Replace(readTestdata(t, "thick/00-multus.conf"), "/host/etc/cni/net.d/10-flannel.conflist", c.clusterNetwork, 1)
			h.write(t, "00-multus.conf", shim)
			if strings.HasPrefix(c.clusterNetwork, "/host/etc/cni/net.d/") {
				h.write(t, "10-ovn-kubernetes.conf", ovn)
			}
			r := h.start(t)
			waitFor(t, 5*time.Second, "/ready to say why", func() (bool, string) {
				code, body := r.ready(t)
				return code == http.StatusServiceUnavailable && strings.Contains(body, c.want) && strings.Contains(body, "NetworkAttachmentDefinition"), body
			})
			if h.read(t, "00-multus.conf") != shim {
				t.Error("the installer edited Multus's config")
			}
			if c.name == "single-plugin conf" && h.read(t, "10-ovn-kubernetes.conf") != ovn {
				t.Error("the installer edited the default network's .conf")
			}
		})
	}
}

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata/multus", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// With LINKERD_CNI_STANDALONE_CONF the installer writes the plugin's config alone, where Multus
// finds it for a NetworkAttachmentDefinition of its name, and touches nothing else; uninstall
// removes it.
func TestStandaloneConf(t *testing.T) {
	h := newHost(t)
	h.cfg.StandaloneConf = "linkerd-cni.conf"
	const ovn = `{"cniVersion":"0.4.0","name":"ovn-kubernetes","type":"ovn-k8s-cni-overlay","ipam":{},"dns":{}}`
	h.write(t, "10-ovn-kubernetes.conf", ovn)
	r := h.start(t)
	r.waitReady(t)
	in, err := newInstaller(h.cfg.withDefaults(), nil)
	if err != nil {
		t.Fatal(err)
	}
	in.syncAll()
	if ok, why := in.pluginInPlace(); !ok {
		t.Errorf("the startup taint would stay: %s", why)
	}
	conf, err := libcni.NetworkPluginConfFromBytes([]byte(h.read(t, "linkerd-cni.conf")))
	if err != nil {
		t.Fatalf("the standalone config does not load: %v", err)
	}
	if conf.Network.Name != "linkerd-cni" || conf.Network.Type != "linkerd-cni" || conf.Network.CNIVersion != "0.4.0" {
		t.Errorf("standalone config %+v: want name and type linkerd-cni, cniVersion 0.4.0", conf.Network)
	}
	if _, err := cniplugin.ParseConfig(conf.Bytes); err != nil {
		t.Errorf("the plugin refuses the standalone config: %v", err)
	}
	if h.read(t, "10-ovn-kubernetes.conf") != ovn {
		t.Error("the installer chained into another config")
	}
	if os.Geteuid() == 0 {
		checkOwner(t, "written", filepath.Join(h.netDir, "linkerd-cni.conf"), 0, 0, 0o600)
	}
	// Removed by someone: put back.
	if err := os.Remove(filepath.Join(h.netDir, "linkerd-cni.conf")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the standalone config to be rewritten", func() (bool, string) {
		_, err := os.Stat(filepath.Join(h.netDir, "linkerd-cni.conf"))
		return err == nil, fmt.Sprint(err)
	})
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if got := dirNames(t, h.netDir); !slices.Equal(got, []string{"10-ovn-kubernetes.conf"}) {
		t.Errorf("net dir after uninstall: %v", got)
	}
}

// deploy/examples/multus holds NetworkAttachmentDefinitions that Multus can run: an inline config
// the plugin accepts, named like its NetworkAttachmentDefinition (Multus resolves a
// NetworkAttachmentDefinition without spec.config to the config of that name in
// /etc/cni/multus/net.d: the standalone config's name); and a workload naming one of them.
func TestNetworkAttachmentExample(t *testing.T) {
	ms := loadManifests(t, filepath.Join(deployDir(t), "examples", "multus"))
	nads := map[string]bool{}
	var standaloneName struct{ Name string }
	if err := json.Unmarshal([]byte(DefaultNetworkConfig), &standaloneName); err != nil {
		t.Fatal(err)
	}
	workloads := 0
	for _, m := range ms {
		switch m.obj.GetKind() {
		case "NetworkAttachmentDefinition":
			if m.obj.GetAPIVersion() != "k8s.cni.cncf.io/v1" {
				t.Errorf("%s: apiVersion %s", m, m.obj.GetAPIVersion())
			}
			nads[m.obj.GetNamespace()+"/"+m.obj.GetName()] = true
			config, _, _ := unstructured.NestedString(m.obj.Object, "spec", "config")
			if config == "" {
				if m.obj.GetName() != standaloneName.Name {
					t.Errorf("%s has no spec.config, so Multus looks for a config named %q: the standalone config is named %q", m, m.obj.GetName(), standaloneName.Name)
				}
				continue
			}
			conf, err := libcni.NetworkPluginConfFromBytes([]byte(config))
			if err != nil {
				t.Errorf("%s: Multus cannot load spec.config: %v", m, err)
				continue
			}
			if conf.Network.Name != m.obj.GetName() {
				t.Errorf("%s: spec.config is named %q", m, conf.Network.Name)
			}
			if _, err := cniplugin.ParseConfig(conf.Bytes); err != nil {
				t.Errorf("%s: the plugin refuses spec.config: %v", m, err)
			}
		case "Deployment":
			workloads++
			ann, _, _ := unstructured.NestedStringMap(m.obj.Object, "spec", "template", "metadata", "annotations")
			for _, n := range strings.Split(ann["k8s.v1.cni.cncf.io/networks"], ",") {
				n = strings.TrimSpace(n)
				if !strings.Contains(n, "/") {
					n = m.obj.GetNamespace() + "/" + n
				}
				if !nads[n] {
					t.Errorf("%s names network %q, which the example does not define", m, n)
				}
			}
		}
	}
	if len(nads) == 0 || workloads == 0 {
		t.Errorf("the example has %d NetworkAttachmentDefinitions and %d workloads", len(nads), workloads)
	}
}
