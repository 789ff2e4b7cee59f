package helmchart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// repoRoot is the repository, from this package's directory.
const repoRoot = "../.."

// presetRow is one row of docs/helm-chart.md's table of distribution presets.
type presetRow struct {
	distribution, netDir, binDir, criSocket string
	// sets are the other values the preset sets, as the table's backticked `key: value` pairs.
	sets map[string]any
}

// presetsTable parses the first table under "### Distribution presets" in docs/helm-chart.md.
func presetsTable(t *testing.T) []presetRow {
	t.Helper()
	const page = "docs/helm-chart.md"
	b, err := os.ReadFile(filepath.Join(repoRoot, page))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### Distribution presets\n")
	if !ok {
		t.Fatalf("%s has no section \"### Distribution presets\"", page)
	}
	var rows []presetRow
	header := true
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "|") {
			if len(rows) > 0 || (!header && line == "") {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		if header {
			want := []string{"`distribution`", "net dir", "bin dir", "CRI socket", "other values it sets", "for"}
			if !slices.Equal(cells, want) {
				t.Fatalf("%s: the presets table's columns are %q, want %q", page, cells, want)
			}
			header = false
			continue
		}
		if strings.HasPrefix(cells[0], "---") {
			continue
		}
		if len(cells) != 6 {
			t.Fatalf("%s: presets row %q has %d cells, want 6", page, line, len(cells))
		}
		r := presetRow{distribution: strings.Trim(cells[0], "`"), netDir: cells[1], binDir: cells[2], criSocket: cells[3], sets: map[string]any{}}
		if r.distribution == `""` {
			r.distribution = ""
		}
		for _, m := range regexp.MustCompile("`([^`]*)`").FindAllStringSubmatch(cells[4], -1) {
			var kv map[string]any
			if err := yaml.Unmarshal([]byte(m[1]), &kv); err != nil || len(kv) != 1 {
				t.Fatalf("%s: preset %q sets %q, which is not one `key: value` (%v)", page, r.distribution, m[1], err)
			}
			for k, v := range kv {
				setPath(r.sets, k, v)
			}
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatalf("%s: no rows in the presets table", page)
	}
	return rows
}

// setPath sets a dotted key (agent.criSocket) in nested values.
func setPath(values map[string]any, key string, v any) {
	parts := strings.Split(key, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := values[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			values[p] = next
		}
		values = next
	}
	values[parts[len(parts)-1]] = v
}

// schemaPresets are the distributions values.schema.json accepts.
func schemaPresets(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, ChartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Distribution struct {
				Pattern string `json:"pattern"`
			} `json:"distribution"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	p := schema.Properties.Distribution.Pattern
	inner, ok := strings.CutPrefix(p, "^(")
	if inner, ok2 := strings.CutSuffix(inner, ")$"); ok && ok2 {
		return strings.Split(inner, "|")
	}
	t.Fatalf("values.schema.json: distribution pattern %q is not ^(a|b|...)$", p)
	return nil
}

// daemonSet decodes the rendered DaemonSet.
func daemonSet(t *testing.T, files map[string]string) *appsv1.DaemonSet {
	t.Helper()
	var ds appsv1.DaemonSet
	if err := yaml.Unmarshal([]byte(files["30-daemonset.yaml"]), &ds); err != nil || ds.Kind != "DaemonSet" {
		t.Fatalf("30-daemonset.yaml: %v (kind %q)", err, ds.Kind)
	}
	return &ds
}

// TestPresetsTable holds docs/helm-chart.md's table of distribution presets to the chart: it
// names every preset the schema accepts, each preset's rendering mounts the table's net dir, bin
// dir and CRI socket from the node and passes them to the installer and the agent, and it is
// byte for byte the rendering without a preset but with the table's values set explicitly, so a
// preset can change nothing the table does not say.
func TestPresetsTable(t *testing.T) {
	ch, err := Load(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	rows := presetsTable(t)
	var documented []string
	for _, r := range rows {
		documented = append(documented, r.distribution)
	}
	if schema := schemaPresets(t); !slices.Equal(slices.Sorted(slices.Values(documented)), slices.Sorted(slices.Values(schema))) {
		t.Errorf("docs/helm-chart.md's presets table has %q, values.schema.json accepts %q", documented, schema)
	}
	for _, r := range rows {
		t.Run("preset="+r.distribution, func(t *testing.T) {
			files, err := Render(ch, map[string]any{"distribution": r.distribution})
			if err != nil {
				t.Fatal(err)
			}
			ds := daemonSet(t, files)
			hostPaths := map[string]string{}
			for _, v := range ds.Spec.Template.Spec.Volumes {
				if v.HostPath != nil {
					hostPaths[v.Name] = v.HostPath.Path
					if v.Name == "cri-socket" && v.HostPath.Type != nil && *v.HostPath.Type != "" {
						t.Errorf("the CRI socket's hostPath has type %q: a node without that socket would not start the pod", *v.HostPath.Type)
					}
				}
			}
			want := map[string]string{"cni-net-dir": r.netDir, "cni-bin-dir": r.binDir, "cri-socket": r.criSocket}
			for name, path := range want {
				if hostPaths[name] != path {
					t.Errorf("hostPath %s is %q, the table says %q", name, hostPaths[name], path)
				}
			}
			containers := map[string]corev1.Container{}
			for _, c := range ds.Spec.Template.Spec.Containers {
				containers[c.Name] = c
			}
			env := map[string]string{}
			for _, e := range containers["install-cni"].Env {
				env[e.Name] = e.Value
			}
			if env["DEST_CNI_NET_DIR"] != r.netDir || env["DEST_CNI_BIN_DIR"] != r.binDir {
				t.Errorf("install-cni's DEST_CNI_NET_DIR %q, DEST_CNI_BIN_DIR %q; the table says %q, %q", env["DEST_CNI_NET_DIR"], env["DEST_CNI_BIN_DIR"], r.netDir, r.binDir)
			}
			agent, ok := containers["linkerd-cni-agent"]
			if !ok {
				t.Fatalf("no linkerd-cni-agent container in the default rendering (containers %v)", ds.Spec.Template.Spec.Containers)
			}
			if arg := "--cri-socket=unix:///host" + r.criSocket; !slices.Contains(agent.Args, arg) {
				t.Errorf("the agent's arguments %q lack %s", agent.Args, arg)
			}

			// The same rendering from explicit values, without the preset.
			explicit := map[string]any{"destCNINetDir": r.netDir, "destCNIBinDir": r.binDir, "agent": map[string]any{"criSocket": r.criSocket}}
			for k, v := range r.sets {
				if m, ok := v.(map[string]any); ok && k == "agent" {
					for ak, av := range m {
						explicit["agent"].(map[string]any)[ak] = av
					}
					continue
				}
				explicit[k] = v
			}
			same, err := Render(ch, explicit)
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range Names(files) {
				if files[name] != same[name] {
					t.Errorf("%s differs between distribution %q and %v: the preset changes something the table does not say", name, r.distribution, explicit)
				}
			}
			if len(same) != len(files) {
				t.Errorf("distribution %q renders %v, the explicit values %v", r.distribution, Names(files), Names(same))
			}
		})
	}
}
