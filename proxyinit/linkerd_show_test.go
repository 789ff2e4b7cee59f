package proxyinit

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// linkerdInitArgs returns the linkerd-init container's arguments in one of the pod specs
// Linkerd's injector wrote (test/e2e/testdata/linkerd).
func linkerdInitArgs(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "test", "e2e", "testdata", "linkerd", file))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Spec struct {
			Template struct {
				Spec struct {
					InitContainers []struct {
						Name string
						Args []string
					} `json:"initContainers"`
				}
			}
		}
	}
	if err := yaml.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	for _, c := range d.Spec.Template.Spec.InitContainers {
		if c.Name == "linkerd-init" {
			return c.Args
		}
	}
	t.Fatalf("%s has no linkerd-init container", file)
	return nil
}

// cniDefaultConfig is the rule configuration the CNI plugin gives a pod under our chart's
// default network config (deploy/linkerd-cni, Linkerd's chart's), through the plugin's own
// parsing and merge; apiServerPorts are a control-plane pod's.
func cniDefaultConfig(t *testing.T, apiServerPorts []string) *iptables.Ruleset {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "deploy", "linkerd-cni", "20-configmap.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var cm struct{ Data map[string]string }
	if err := yaml.Unmarshal(data, &cm); err != nil {
		t.Fatal(err)
	}
	conf, err := cniplugin.ParseConfig([]byte(strings.ReplaceAll(cm.Data["cni_network_config"], "__KUBECONFIG_FILEPATH__", "/etc/cni/net.d/kubeconfig")))
	if err != nil {
		t.Fatal(err)
	}
	s, err := cniplugin.Merge(conf.Linkerd.Config, conf.Ceilings, cniplugin.Object{Kind: "pod", Name: "emojivoto/web-0"}, nil, apiServerPorts)
	if err != nil {
		t.Fatal(err)
	}
	return s.Rules
}

// TestShowLinkerdDefaults runs troubleshooting.md's command, `proxy-init show --netns PATH` with
// no rule flags, against the rules Linkerd's defaults write: the linkerd-init arguments of
// Linkerd 2.19's and 2.20's injected pods, and the CNI plugin's default network config for a
// workload and a control-plane pod (2.19 and 2.20 pass linkerd-init the same arguments, so
// they share goldens), each written in the modes nft, legacy and nftables into a
// fresh namespace. It exits 0 and prints what testdata/show-*.txt holds: the rules, the command
// line they were written from, and that they are whole.
func TestShowLinkerdDefaults(t *testing.T) {
	nt.RequireRoot(t, "it writes rules into network namespaces")
	type layout struct {
		name, golden string
		write        func(t *testing.T, netns string, mode iptables.Mode)
	}
	initContainer := func(file string) func(*testing.T, string, iptables.Mode) {
		return func(t *testing.T, netns string, mode iptables.Mode) {
			args := append(linkerdInitArgs(t, file), "--netns", netns, "--iptables-mode", string(mode))
			var stdout, stderr bytes.Buffer
			if code := Main(context.Background(), args, &stdout, &stderr); code != ExitOK {
				t.Fatalf("proxy-init %q: exit %d\n%s", args, code, stderr.String())
			}
		}
	}
	plugin := func(apiServerPorts []string) func(*testing.T, string, iptables.Mode) {
		return func(t *testing.T, netns string, mode iptables.Mode) {
			rs := cniDefaultConfig(t, apiServerPorts)
			if _, err := (runner.Runner{}).Apply(context.Background(), runner.Target{Options: runner.Options{Mode: mode}, NetNS: netns}, rs); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, l := range []layout{
		{"linkerd-2.19", "linkerd-init", initContainer("linkerd-2.19.yaml")},
		{"linkerd-2.20", "linkerd-init", initContainer("linkerd-2.20-default.yaml")},
		{"cni-workload", "cni-workload", plugin(nil)},
		{"cni-control-plane", "cni-control-plane", plugin(cniplugin.FallbackAPIServerPorts)},
	} {
		for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeLegacy, iptables.ModeNFTables} {
			t.Run(l.name+"/"+string(mode), func(t *testing.T) {
				n := nt.NewNS(t)
				l.write(t, n.Path(), mode)
				var stdout, stderr bytes.Buffer
				code := Main(context.Background(), []string{"show", "--netns", n.Path()}, &stdout, &stderr)
				if code != ExitOK {
					t.Errorf("show: exit %d\n%s%s", code, stdout.String(), stderr.String())
				}
				iptablestest.CheckGolden(t, filepath.Join("testdata", "show-"+l.golden+"-"+string(mode)+".txt"), stdout.String(), *update, "proxyinit")
			})
		}
	}
}

// TestShowNotWhole: show without rule flags exits 1 and says why when the rules in place are
// not whole, and show with the chart's flags but not its --ipv6=false names IPv6's absence
// without calling the single-transaction nft mode half-applied.
func TestShowNotWhole(t *testing.T) {
	nt.RequireRoot(t, "it writes rules into network namespaces")
	linkerd := linkerdInitArgs(t, "linkerd-2.20-default.yaml")
	for _, c := range []struct {
		name  string
		setup func(t *testing.T, n *nt.NS)
		show  []string
		want  []string
	}{
		{"a jump deleted", func(t *testing.T, n *nt.NS) {
			if _, err := nt.RunIn(t, n, "iptables-nft", "-t", "nat", "-D", "OUTPUT", "1"); err != nil {
				t.Fatal(err)
			}
		}, nil, []string{
			`  missing: -A OUTPUT -m comment --comment "proxy-init/install-proxy-init-output" -j PROXY_INIT_OUTPUT`,
			"NOT whole: ipv4 lacks 1 of the jumps into our chains: packets never reach their rules",
		}},
		{"rules in two backends", func(t *testing.T, n *nt.NS) {
			rs := iptablestest.Build(t, iptablestest.ChartConfig())
			if _, err := nt.RunInWithInput(t, n, iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(iptables.IPv4)), "iptables-legacy-restore", "--noflush"); err != nil {
				t.Fatal(err)
			}
		}, nil, []string{
			"NOT whole: iptables-legacy also holds rules of ours, left by a run in another mode (apply or cleanup removes them)",
		}},
		{"another mode named", nil, []string{"--iptables-mode", "legacy"}, []string{
			"NOT whole: the rules are iptables-nft's, which mode legacy (from --iptables-mode) does not write: a run in another mode wrote them",
		}},
		{"flags without --ipv6=false", nil, slices.DeleteFunc(slices.Clone(linkerd), func(a string) bool { return a == "--ipv6=false" }), []string{
			"ipv4 has every rule but ipv6 has none: no run was cut short (iptables-nft writes both families in one transaction): they were written without ipv6, or removed since; apply again to write them",
			"rules do NOT match the configuration",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := nt.NewNS(t)
			var stdout, stderr bytes.Buffer
			if code := Main(context.Background(), append(slices.Clone(linkerd), "--netns", n.Path()), &stdout, &stderr); code != ExitOK {
				t.Fatalf("apply: exit %d\n%s", code, stderr.String())
			}
			if c.setup != nil {
				c.setup(t, n)
			}
			stdout.Reset()
			code := Main(context.Background(), append([]string{"show", "--netns", n.Path()}, c.show...), &stdout, &stderr)
			if code != ExitFailure || strings.Contains(stdout.String(), "half-applied") {
				t.Errorf("show: exit %d, want 1 and no half-applied\n%s", code, stdout.String())
			}
			for _, w := range c.want {
				if !strings.Contains(stdout.String(), w+"\n") {
					t.Errorf("show's output lacks %q:\n%s", w, stdout.String())
				}
			}
		})
	}
}
