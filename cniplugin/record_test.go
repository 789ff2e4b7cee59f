package cniplugin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// stateDirOf is the state-dir withVersion gave a call.
func stateDirOf(t *testing.T, args *skel.CmdArgs) string {
	t.Helper()
	var conf struct {
		StateDir string `json:"state-dir"`
	}
	if err := json.Unmarshal(args.StdinData, &conf); err != nil || conf.StateDir == "" {
		t.Fatalf("no state-dir in the call's config: %v", err)
	}
	return conf.StateDir
}

// ADD records what a pod author controls of the rules (the honoured annotations of the pod and,
// when one is missing there, of its namespace; the control-plane label and the API server's ports),
// in a file of mode 0600 only, and DEL removes it, leaving nothing behind.
func TestAddRecordsTheSettingsAndDelRemovesThem(t *testing.T) {
	r := newPolicyRig(t, meshedPod(map[string]string{LabelControlPlaneComponent: "destination"},
		map[string]string{AnnotationSkipOutboundPorts: "3306", "config.linkerd.io/opaque-ports": "4000"}))
	r.api.ns = &Namespace{ObjectMeta: ObjectMeta{Name: "web", Annotations: map[string]string{AnnotationSkipInboundPorts: "9090", "team": "a"}}}
	r.api.svc = &Service{Spec: ServiceSpec{Ports: []ServicePort{{Port: 443, TargetPort: TargetPort{Number: 6443}}}}}
	args := r.args(t)
	args.Args += ";K8S_POD_UID=0b8f"
	if err := r.plugin.Add(args); err != nil {
		t.Fatalf("ADD: %v\n%s", err, r.logs.String())
	}
	dir := filepath.Join(stateDirOf(t, args), RecordsDir)
	path := filepath.Join(dir, "c1.json")
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("record mode %o, want 0600", fi.Mode().Perm())
	}
	got, _ := os.ReadFile(path)
	want := `{"v":1,"pod":"web/api-0","podUID":"0b8f","inputs":{"pod":{"config.linkerd.io/skip-outbound-ports":"3306"},` +
		`"namespace":{"config.linkerd.io/skip-inbound-ports":"9090"},"controlPlane":true,"apiServerPorts":["443","6443"]}}`
	if string(got) != want {
		t.Errorf("record\n got %s\nwant %s", got, want)
	}
	if err := r.plugin.Del(args); err != nil {
		t.Fatal(err)
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
		t.Errorf("records left after DEL: %v %v", left, err)
	}
}

// CHECK expects the settings the sandbox was set up with: an annotation edited since changes
// nothing; without the record, the current annotations are expected.
func TestCheckExpectsTheRecordedSettings(t *testing.T) {
	r := newPolicyRig(t, meshedPod(nil, map[string]string{AnnotationSkipOutboundPorts: "3306"}))
	args := r.args(t)
	if err := r.plugin.Add(args); err != nil {
		t.Fatalf("ADD: %v", err)
	}
	r.api.pod.Annotations[AnnotationSkipOutboundPorts] = "1-65535"
	if err := r.plugin.Check(args); err != nil {
		t.Errorf("CHECK after an annotation edit: %v", err)
	}
	if err := os.Remove(filepath.Join(stateDirOf(t, args), RecordsDir, "c1.json")); err != nil {
		t.Fatal(err)
	}
	if err := r.plugin.Check(args); err == nil || !strings.Contains(err.Error(), "missing: -A PROXY_INIT_OUTPUT -p tcp -m multiport --dports 1:65535") {
		t.Errorf("CHECK without the record: %v; want the current annotation's rules missing", err)
	}
}

// A record that is not the plugin's own (writable by others, of another pod) is refused, naming it.
func TestCheckRefusesARecordNotItsOwn(t *testing.T) {
	tests := []struct {
		name  string
		spoil func(t *testing.T, path string)
		want  string
	}{
		{"writable by others", func(t *testing.T, path string) {
			if err := os.Chmod(path, 0o666); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file of uid"},
		{"another pod's", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(`{"v":1,"pod":"web/other","inputs":{}}`), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "is of pod web/other"},
		{"another version", func(t *testing.T, path string) {
			if err := os.WriteFile(path, []byte(`{"v":2,"pod":"web/api-0","inputs":{}}`), 0o600); err != nil {
				t.Fatal(err)
			}
		}, "version 2, want 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := newPolicyRig(t, meshedPod(nil, nil))
			args := r.args(t)
			if err := r.plugin.Add(args); err != nil {
				t.Fatalf("ADD: %v", err)
			}
			tt.spoil(t, filepath.Join(stateDirOf(t, args), RecordsDir, "c1.json"))
			if err := r.plugin.Check(args); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CHECK: %v; want %q", err, tt.want)
			}
		})
	}
}

// A state directory others may reach is refused before anything is written: the exact error,
// and no rule in the pod's namespace.
func TestAddRefusesAStateDirOthersReach(t *testing.T) {
	netnstest.RequireRoot(t)
	tests := []struct {
		name  string
		spoil func(t *testing.T, state string)
		want  string
	}{
		{"locks open to others", func(t *testing.T, state string) { mkdir(t, filepath.Join(state, LocksDir), 0o755, 0) },
			"locks: mode 0755 gives others access (want at most 0700)"},
		{"locks of another user", func(t *testing.T, state string) { mkdir(t, filepath.Join(state, LocksDir), 0o700, 65534) },
			"locks: owned by uid 65534, not 0"},
		{"state dir writable by others", func(t *testing.T, state string) {
			if err := os.Chmod(state, 0o777); err != nil {
				t.Fatal(err)
			}
		}, ": mode 0777 gives others access (want at most 0755)"},
		{"records a symbolic link", func(t *testing.T, state string) {
			if err := os.Symlink(t.TempDir(), filepath.Join(state, RecordsDir)); err != nil {
				t.Fatal(err)
			}
		}, "pods: not a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := netnstest.NewNS(t)
			state := filepath.Join(t.TempDir(), "state")
			mkdir(t, state, 0o700, 0)
			tt.spoil(t, state)
			conf := strings.Replace(linkerdChartConfig, `"log_level":"info",`, `"log_level":"info","state-dir":"`+state+`",`, 1)
			var out, logs strings.Builder
			api := &fakeAPI{pod: meshedPod(nil, nil), ns: &Namespace{}}
			p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: func(*NetConf) (PodAPI, error) { return api, nil }}
			args := &skel.CmdArgs{ContainerID: "c1", Netns: n.Path(), IfName: "eth0",
				Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0", StdinData: withVersion(t, conf, "1.0.0")}
			err := p.Add(args)
			if err == nil || !strings.Contains(err.Error(), "refusing "+state) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("ADD: %v; want a refusal of %s naming %q", err, state, tt.want)
			}
			ruleset, err := netnstest.RunIn(t, n, "nft", "list", "ruleset")
			if err != nil {
				t.Fatal(err)
			}
			if strings.TrimSpace(ruleset) != "" {
				t.Errorf("rules written despite the refusal:\n%s", ruleset)
			}
		})
	}
}

func mkdir(t *testing.T, dir string, mode os.FileMode, uid int) {
	t.Helper()
	if err := os.Mkdir(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, uid); err != nil {
		t.Fatal(err)
	}
}

// SweepRecords removes the records of pods no longer on the node and temporary files, once old
// enough, and nothing else.
func TestSweepRecords(t *testing.T) {
	dir := filepath.Join(t.TempDir(), RecordsDir)
	mkdir(t, dir, 0o700, os.Geteuid())
	old := time.Now().Add(-time.Hour)
	files := map[string]struct {
		body      string
		old, kept bool
	}{
		"live.json":         {`{"v":1,"pod":"web/live","podUID":"1","inputs":{}}`, true, true},
		"gone.json":         {`{"v":1,"pod":"web/gone","podUID":"2","inputs":{}}`, true, false},
		"reused.json":       {`{"v":1,"pod":"web/live","podUID":"3","inputs":{}}`, true, false},
		"fresh.json":        {`{"v":1,"pod":"web/gone","podUID":"4","inputs":{}}`, false, true},
		"garbled.json":      {`{"v":`, true, false},
		".tmp-x.json-1":     {`{"v":`, true, false},
		".tmp-y.json-2":     {`{"v":`, false, true},
		"not-a-record.yaml": {`x`, true, true},
	}
	for name, f := range files {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(f.body), 0o600); err != nil {
			t.Fatal(err)
		}
		if f.old {
			if err := os.Chtimes(path, old, old); err != nil {
				t.Fatal(err)
			}
		}
	}
	n, err := SweepRecords(dir, time.Minute, func(pod, uid string) bool { return pod == "web/live" && uid == "1" })
	if err != nil || n != 4 {
		t.Errorf("SweepRecords removed %d, %v; want 4", n, err)
	}
	for name, f := range files {
		if _, err := os.Stat(filepath.Join(dir, name)); (err == nil) != f.kept {
			t.Errorf("%s: kept %v, want %v", name, err == nil, f.kept)
		}
	}
}

// proxy-init --netns looks for the host locks where the plugin keeps them by default.
func TestDefaultLockDirIsProxyInits(t *testing.T) {
	if got := filepath.Join(DefaultStateDir, LocksDir); got != runner.DefaultHostLockDir {
		t.Errorf("the plugin's lock directory %s, proxy-init's %s", got, runner.DefaultHostLockDir)
	}
}

// TestRecordPathRefusesUnsafeIDs: a container ID becomes a file name under the state directory,
// so only what CNI allows in one, up to 255 bytes, is taken; anything else is refused by name.
func TestRecordPathRefusesUnsafeIDs(t *testing.T) {
	long := strings.Repeat("a", 255)
	for id, want := range map[string]string{
		"5f0c1a":      "/state/pods/5f0c1a.json",
		"web-1.2_3":   "/state/pods/web-1.2_3.json",
		long:          "/state/pods/" + long + ".json",
		"":            `container ID "": not usable as a file name`,
		"../etc":      `container ID "../etc": not usable as a file name`,
		"a/b":         `container ID "a/b": not usable as a file name`,
		".hidden":     `container ID ".hidden": not usable as a file name`,
		long + "a":    `container ID "` + long + `a": not usable as a file name`,
		"with space":  `container ID "with space": not usable as a file name`,
		"nul\x00byte": `container ID "nul\x00byte": not usable as a file name`,
	} {
		c := &call{args: &skel.CmdArgs{ContainerID: id}, conf: &NetConf{StateDir: "/state"}}
		got, err := c.recordPath()
		if err != nil {
			got = err.Error()
		}
		if got != want {
			t.Errorf("recordPath(%q) = %q, want %q", id, got, want)
		}
	}
}
