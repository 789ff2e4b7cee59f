package cniplugin

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/runner"
	"github.com/kubemesh/proxy-init/test/netnstest"
)

// TestCommandsInNetns runs ADD, CHECK and DEL in-process against a real namespace, with the API
// faked: the fast root test of the netns and backend plumbing, for every mode. The libcni and
// kube-apiserver suite is in integration_test.go.
func TestCommandsInNetns(t *testing.T) {
	for _, mode := range []iptables.Mode{iptables.ModeNFTables, iptables.ModeNFT, iptables.ModeLegacy} {
		t.Run(string(mode), func(t *testing.T) {
			n := netnstest.NewNS(t)
			conf := strings.Replace(linkerdChartConfig, `"iptables-mode":"nft"`, `"iptables-mode":"`+string(mode)+`"`, 1)
			conf = strings.Replace(conf, `"ipv6":false`, `"ipv6":true`, 1)
			api := &fakeAPI{
				pod: meshedPod(nil, map[string]string{AnnotationCloseWaitTimeout: "42s"}),
				ns:  &Namespace{ObjectMeta: ObjectMeta{Name: "web", Annotations: map[string]string{AnnotationSkipOutboundPorts: "3306"}}},
			}
			var out, logs bytes.Buffer
			p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: func(*NetConf) (PodAPI, error) { return api, nil }}
			args := &skel.CmdArgs{ContainerID: "ctr", Netns: n.Path(), IfName: "eth0",
				Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0", StdinData: withVersion(t, conf, "1.0.0")}
			if err := p.Add(args); err != nil {
				t.Fatalf("ADD: %v\n%s", err, logs.String())
			}
			jsonEqual(t, out.String(), prevResults["1.0.0"])

			want := iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1,
				InboundPortsToIgnore: []string{"4191", "4190"}, OutboundPortsToIgnore: []string{"3306"},
				Mode: mode, IPv6: true}
			rs, err := iptables.Build(want)
			if err != nil {
				t.Fatal(err)
			}
			show := func() iptables.State {
				var st iptables.State
				if err := n.Do(func() error {
					a, _, err := runner.New(runner.Options{Mode: mode})
					if err != nil {
						return err
					}
					st, err = a.Show(context.Background(), rs)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				return st
			}
			if st := show(); !st.Match() || len(st.Families) == 0 {
				t.Fatalf("rules after ADD differ: %+v", st)
			}
			var cw string
			if err := n.Do(func() error {
				b, err := readFileString(iptables.CloseWaitSysctl)
				cw = b
				return err
			}); err != nil || cw != "42" {
				t.Errorf("close-wait sysctl %q, %v; want 42", cw, err)
			}

			out.Reset()
			if err := p.Check(args); err != nil {
				t.Fatalf("CHECK: %v", err)
			}
			if out.Len() != 0 {
				t.Errorf("CHECK wrote %q to stdout", out.String())
			}
			// An annotation edited after ADD changes nothing CHECK expects: annotations are read
			// when the sandbox is set up (record.go).
			api.ns.Annotations[AnnotationSkipOutboundPorts] = "5432"
			if err := p.Check(args); err != nil {
				t.Errorf("CHECK after an annotation edit: %v", err)
			}
			// An ADD (a new set-up) takes it: CHECK then names the rules of the old settings.
			if err := p.Add(args); err != nil {
				t.Fatal(err)
			}
			if _, err := (runner.Runner{}).Apply(context.Background(), runner.Target{NetNS: n.Path(), Options: runner.Options{Mode: mode}}, rs); err != nil {
				t.Fatal(err)
			}
			err = p.Check(args)
			if err == nil {
				t.Fatal("CHECK passed with rules for another config")
			}
			for _, s := range []string{"missing:", "extra:", "5432", "3306"} {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("CHECK error lacks %q:\n%v", s, err)
				}
			}
			// ADD again converges; CHECK agrees.
			if err := p.Add(args); err != nil {
				t.Fatal(err)
			}
			if err := p.Check(args); err != nil {
				t.Errorf("CHECK after re-ADD: %v", err)
			}

			if err := p.Del(args); err != nil {
				t.Fatal(err)
			}
			if st := show(); !stateEmpty(st) {
				t.Errorf("rules left after DEL: %+v", st)
			}
			if err := p.Del(args); err != nil {
				t.Errorf("second DEL: %v", err)
			}
			// An unmeshed pod passes CHECK without rules of ours, and fails with them.
			meshed := api.pod
			api.pod = &Pod{Spec: PodSpec{Containers: containers("app")}}
			if err := p.Check(args); err != nil {
				t.Errorf("CHECK of an unmeshed pod without rules: %v", err)
			}
			api.pod = meshed
			if err := p.Add(args); err != nil {
				t.Fatal(err)
			}
			api.pod = &Pod{Spec: PodSpec{Containers: containers("app")}}
			if err := p.Check(args); err == nil || !strings.Contains(err.Error(), "unmeshed pod has rules") {
				t.Errorf("CHECK of an unmeshed pod with rules: %v", err)
			}
		})
	}
}

func stateEmpty(st iptables.State) bool {
	for _, f := range st.Families {
		if len(f.Rules) > 0 {
			return false
		}
	}
	return true
}

func readFileString(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

// TestFeatureKeysInNetns: the CNI config keys of the features beyond Linkerd's reach the rules
// written into a real namespace, CHECK agrees, and DEL removes the rules and the policy routing;
// a bad key fails ADD naming it, with nothing written.
func TestFeatureKeysInNetns(t *testing.T) {
	const keys = `"redirect-dns-to-port":5353,"inbound-mode":"tproxy","outbound-ports-to-redirect":[80,443],` +
		`"outbound-subnets-to-redirect":["192.0.2.0/24"],"interfaces-to-ignore":["net1"],"uids-to-ignore":[1000],` +
		`"gids-to-ignore":["3000"],"drop-invalid":true,"ipv6":"auto","reroute-virtual-interfaces":["tap0"]`
	for _, mode := range []iptables.Mode{iptables.ModeNFTables, iptables.ModeNFT, iptables.ModeLegacy} {
		t.Run(string(mode), func(t *testing.T) {
			n := netnstest.NewNS(t)
			conf := strings.Replace(linkerdChartConfig, `"iptables-mode":"nft","ipv6":false`, `"iptables-mode":"`+string(mode)+`",`+keys, 1)
			// At debug the plugin logs, with the backend's choice, what ipv6=auto decided.
			conf = strings.Replace(conf, `"log_level":"info"`, `"log_level":"debug"`, 1)
			// The namespace's annotation replaces the key's virtual machine interfaces.
			api := &fakeAPI{pod: meshedPod(nil, nil), ns: &Namespace{ObjectMeta: ObjectMeta{Name: "web",
				Annotations: map[string]string{AnnotationRerouteVirtualInterfaces: "k6t-eth0"}}}}
			var out, logs bytes.Buffer
			p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: func(*NetConf) (PodAPI, error) { return api, nil }}
			args := &skel.CmdArgs{ContainerID: "ctr", Netns: n.Path(), IfName: "eth0",
				Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0", StdinData: withVersion(t, conf, "1.0.0")}
			show := func(rs *iptables.Ruleset) iptables.State {
				t.Helper()
				st, err := runner.Runner{}.Show(context.Background(), runner.Target{NetNS: n.Path(), Options: runner.Options{Mode: mode}}, rs)
				if err != nil {
					t.Fatal(err)
				}
				return st
			}
			want, err := iptables.Build(iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1,
				InboundPortsToIgnore: []string{"4191", "4190"}, Mode: mode, IPv6Auto: true,
				RedirectDNSToPort: 5353, InboundMode: iptables.InboundTPROXY, OutboundPortsToRedirect: []string{"80", "443"},
				OutboundSubnetsToRedirect: []string{"192.0.2.0/24"}, InterfacesToIgnore: []string{"net1"},
				UIDsToIgnore: []string{"1000"}, GIDsToIgnore: []string{"3000"}, DropInvalid: true,
				RerouteVirtualInterfaces: []string{"k6t-eth0"}})
			if err != nil {
				t.Fatal(err)
			}

			bad := args
			bad.StdinData = withVersion(t, strings.Replace(conf, `"drop-invalid":true`, `"drop-invalid":true,"dns-servers-only":true`, 1), "1.0.0")
			err = p.Add(bad)
			if msg := `linkerd.dns-servers-only "true": not offered by the CNI plugin`; err == nil || !strings.Contains(err.Error(), msg) {
				t.Errorf("ADD with dns-servers-only: %v, want an error with %q", err, msg)
			}
			if st := show(want); !stateEmpty(st) || (st.Routes != nil && len(st.Routes.Lines) > 0) {
				t.Fatalf("a refused ADD wrote: %+v", st)
			}

			args.StdinData = withVersion(t, conf, "1.0.0")
			if err := p.Add(args); err != nil {
				t.Fatalf("ADD: %v\n%s", err, logs.String())
			}
			st := show(want)
			if !st.Match() || st.Routes == nil || len(st.Routes.Lines) != 2 {
				t.Errorf("after ADD: %+v", st)
			}
			// The namespace has no IPv6 address but loopback's: auto wrote no IPv6 rules.
			if !strings.Contains(logs.String(), "ipv6=auto: writing no IPv6 rules") {
				t.Errorf("the log does not say what ipv6=auto decided:\n%s", logs.String())
			}
			if err := p.Check(args); err != nil {
				t.Errorf("CHECK: %v", err)
			}
			if err := p.Del(args); err != nil {
				t.Fatal(err)
			}
			if st := show(want); !stateEmpty(st) || (st.Routes != nil && len(st.Routes.Lines) > 0) {
				t.Errorf("left after DEL: %+v", st)
			}
		})
	}
}

// TestCeilingsInNetns: an ADD whose pod or namespace asks beyond the node's ceilings fails with an
// error naming the annotation, the value (or a list's length) and the ceiling, and writes nothing:
// no rule in any backend, and the namespace's close-wait sysctl as the kernel left it.
func TestCeilingsInNetns(t *testing.T) {
	many := strings.TrimSuffix(strings.Repeat("192.0.2.1/32,", 1025), ",")
	tests := []struct {
		name      string
		pod, ns   map[string]string
		config    string // replaces `"log_level":"info",` in the chart's config
		wantError string
	}{
		{"close-wait on the pod", map[string]string{AnnotationCloseWaitTimeout: "24h"}, nil, `"log_level":"info",`,
			`invalid annotation: annotation config.linkerd.io/close-wait-timeout="24h" on pod web/api-0: 86400s is more than max-close-wait-timeout-secs allows (3600)`},
		{"close-wait on the namespace, lower ceiling", nil, map[string]string{AnnotationCloseWaitTimeout: "120"},
			`"log_level":"info","max-close-wait-timeout-secs":60,`,
			`invalid annotation: annotation config.linkerd.io/close-wait-timeout="120" on namespace web: 120s is more than max-close-wait-timeout-secs allows (60)`},
		{"subnets on the namespace", nil, map[string]string{AnnotationSkipOutboundSubnets: many}, `"log_level":"info",`,
			`invalid annotation: annotation config.linkerd.io/skip-outbound-subnets="(1025 entries)" on namespace web: more entries than max-annotation-list-entries allows (1024)`},
		{"virtual machine interfaces on the pod, lower ceiling", map[string]string{AnnotationRerouteVirtualInterfaces: "tap0,tap1,tap2"}, nil,
			`"log_level":"info","max-annotation-list-entries":2,`,
			`invalid annotation: annotation config.linkerd.io/reroute-virtual-interfaces="(3 entries)" on pod web/api-0: more entries than max-annotation-list-entries allows (2)`},
		{"loopback as a virtual machine interface", map[string]string{AnnotationRerouteVirtualInterfaces: "tap0,lo"}, nil, `"log_level":"info",`,
			`invalid annotation: annotation config.linkerd.io/reroute-virtual-interfaces="tap0,lo" on pod web/api-0: "lo": the pod's own traffic, the proxy's included, arrives on it, not a virtual machine's`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := netnstest.NewNS(t)
			var before string
			if err := n.Do(func() (err error) { before, err = readFileString(iptables.CloseWaitSysctl); return err }); err != nil {
				t.Fatal(err)
			}
			conf := strings.Replace(linkerdChartConfig, `"log_level":"info",`, tt.config, 1)
			api := &fakeAPI{pod: meshedPod(nil, tt.pod), ns: &Namespace{ObjectMeta: ObjectMeta{Name: "web", Annotations: tt.ns}}}
			var out, logs bytes.Buffer
			p := &Plugin{Stdout: &out, Stderr: &logs, NewPodAPI: func(*NetConf) (PodAPI, error) { return api, nil }}
			args := &skel.CmdArgs{ContainerID: "ctr", Netns: n.Path(), IfName: "eth0",
				Args: "K8S_POD_NAMESPACE=web;K8S_POD_NAME=api-0", StdinData: withVersion(t, conf, "1.0.0")}
			err := p.Add(args)
			if err == nil || err.Error() != tt.wantError {
				t.Fatalf("ADD: %v\nwant %s", err, tt.wantError)
			}
			if strings.Contains(logs.String(), "192.0.2.1/32,192.0.2.1/32") {
				t.Errorf("the log echoes the whole list:\n%.300s", logs.String())
			}
			rs, err := iptables.Build(iptables.Config{InboundProxyPort: 4143, OutboundProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1, Mode: iptables.ModeNFT})
			if err != nil {
				t.Fatal(err)
			}
			var after string
			if err := n.Do(func() error {
				for _, mode := range []iptables.Mode{iptables.ModeNFT, iptables.ModeNFTables, iptables.ModeLegacy} {
					a, _, err := runner.New(runner.Options{Mode: mode})
					if err != nil {
						return err
					}
					st, err := a.Show(context.Background(), rs)
					if err != nil {
						return err
					}
					if !stateEmpty(st) {
						t.Errorf("%s holds rules after the refused ADD: %+v", mode, st)
					}
				}
				after, err = readFileString(iptables.CloseWaitSysctl)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if after != before {
				t.Errorf("close-wait sysctl %s after the refused ADD, was %s", after, before)
			}
		})
	}
}
