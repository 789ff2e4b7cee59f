package cniplugin

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/kubemesh/proxy-init/internal/netnstest"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/backend"
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

			want := (Linkerd{IncomingProxyPort: 4143, OutgoingProxyPort: 4140, ProxyUID: 2102, ProxyGID: -1,
				InboundPortsToIgnore: []string{"4191", "4190"}, OutboundPortsToIgnore: []string{"3306"},
				IPTablesMode: mode, IPv6: true}).Config()
			rs, err := iptables.Build(want)
			if err != nil {
				t.Fatal(err)
			}
			show := func() iptables.State {
				var st iptables.State
				if err := n.Do(func() error {
					a, _, err := backend.New(backend.Options{Mode: mode})
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
			// Change what the pod should have: CHECK must name the difference.
			api.ns.Annotations[AnnotationSkipOutboundPorts] = "5432"
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
