package cniplugin

import (
	"errors"
	"strings"
	"testing"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/iptables"
)

// The network config and the annotations are input from the cluster: the parsers must never
// panic, and whatever they accept must build into rules (nothing accepted fails later, at write
// time, with the pod half set up).

func FuzzParseConfig(f *testing.F) {
	f.Add(linkerdChartConfig)
	f.Add(`{"cniVersion":"1.0.0","name":"x","type":"linkerd-cni","kubernetes":{"kubeconfig":"/k"},"linkerd":{"incoming-proxy-port":4143,"outgoing-proxy-port":4140,"proxy-uid":4294967296}}`)
	f.Add(`{"cniVersion":"1.0.0","kubernetes":{"kubeconfig":"/k","timeout":"-1s"},"linkerd":{"ports-to-redirect":"80,81","subnets-to-ignore":["0.0.0.0/0"]}}`)
	f.Add(`{"linkerd":{"inbound-ports-to-ignore":[80,"90-100",null,{}]}}`)
	f.Add(`null`)
	f.Fuzz(func(t *testing.T, data string) {
		conf, err := ParseConfig([]byte(data))
		if err != nil {
			return
		}
		if _, err := iptables.Build(conf.Linkerd.Config); err != nil {
			t.Fatalf("ParseConfig accepted %q, whose linkerd block does not build: %v", data, err)
		}
		// DEL's lenient parse accepts everything the strict one does.
		if _, err := ParseConfigLenient([]byte(data)); err != nil {
			t.Fatalf("ParseConfigLenient refused %q, which ParseConfig accepted: %v", data, err)
		}
	})
}

func FuzzMerge(f *testing.F) {
	f.Add("3306,5432-5440", "9090", "192.0.2.0/24", "203.0.113.0/24", "198.51.100.0/24,2001:db8::/32", "3000", "-1", "5143", "5140", "1h", "k6t-eth0,tap0")
	f.Add("80,,x", "9000-8000", "nope", "10.0.0.0/33", ",,", "0", "4294967296", "70000", "-5", "18446744074", "lo,tap:0,net+")
	f.Add("", "", "", "", "", "", "", "", "", "", "")
	f.Fuzz(func(t *testing.T, out, in, subnets, inSubnets, outSubnets, uid, gid, inPort, outPort, closeWait, reroute string) {
		values := []string{out, in, subnets, inSubnets, outSubnets, uid, gid, inPort, outPort, closeWait, reroute}
		if len(values) != len(Annotations) {
			t.Fatalf("%d values for %d annotations", len(values), len(Annotations))
		}
		ann := map[string]string{}
		for i, a := range Annotations {
			ann[a] = values[i]
		}
		s, err := Merge(baseConfig(), DefaultCeilings, Object{Kind: "pod", Name: "web/api-0", Annotations: ann}, nil, []string{"443"})
		if err != nil {
			var ae *badinput.Error
			if !errors.As(err, &ae) || len(ae.Problems) == 0 {
				t.Fatalf("Merge failed without naming an annotation: %v", err)
			}
			for _, p := range ae.Problems {
				key := strings.TrimPrefix(p.Field, "annotation ")
				if !strings.HasPrefix(key, "config.linkerd.io/") || (ann[key] != p.Value && !strings.HasSuffix(p.Value, " entries)")) {
					t.Fatalf("problem %s does not name an annotation and its value", p)
				}
			}
			return
		}
		if _, err := iptables.Build(s.Config); err != nil {
			t.Fatalf("Merge accepted %q, which does not build: %v", values, err)
		}
	})
}
