package multicall

import (
	"slices"
	"testing"
)

func TestArgs(t *testing.T) {
	tests := []struct {
		name, program string
		argv          []string
		want          []string
		err           string
	}{
		{name: "own name", program: ProxyInit, argv: []string{"/usr/local/bin/proxy-init", "-p", "4143"}, want: []string{"-p", "4143"}},
		{name: "unknown name runs as usual", program: ProxyInit, argv: []string{"./pi", "show"}, want: []string{"show"}},
		{name: "linkerd2-proxy-init", program: ProxyInit, argv: []string{"/usr/lib/linkerd/linkerd2-proxy-init", "--incoming-proxy-port", "4143"}, want: []string{"--incoming-proxy-port", "4143"}},
		{name: "linkerd2-network-validator", program: ProxyInit, argv: []string{"/usr/lib/linkerd/linkerd2-network-validator", "--timeout", "10s"}, want: []string{"validate", "--timeout", "10s"}},
		{name: "linkerd-network-validator", program: ProxyInit, argv: []string{"linkerd-network-validator"}, want: []string{"validate"}},
		{name: "subcommand already given", program: ProxyInit, argv: []string{"/usr/local/bin/linkerd-network-validator", "validate", "--timeout", "1s"}, want: []string{"validate", "--timeout", "1s"}},
		{name: "repair controller", program: LinkerdCNI, argv: []string{"/usr/lib/linkerd/linkerd-cni-repair-controller", "--admin-addr", "0.0.0.0:9990"}, want: []string{"repair", "--admin-addr", "0.0.0.0:9990"}},
		{name: "installer", program: LinkerdCNI, argv: []string{"/usr/bin/linkerd2-cni-install"}, want: []string{"install"}},
		{name: "other program's name", program: LinkerdCNI, argv: []string{"/x/linkerd2-network-validator"},
			err: "linkerd2-network-validator is a name of the proxy-init binary, not of linkerd-cni: install proxy-init under it"},
		{name: "no argv", program: ProxyInit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Args(tc.program, tc.argv)
			if tc.err != "" {
				if err == nil || err.Error() != tc.err {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("Args(%q, %q) = %q, %v; want %q", tc.program, tc.argv, got, err, tc.want)
			}
		})
	}
}

// Every name is unique and served by one of the two programs.
func TestNames(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range Names {
		if seen[n.Name] {
			t.Errorf("%s listed twice", n.Name)
		}
		seen[n.Name] = true
		if n.Program != ProxyInit && n.Program != LinkerdCNI {
			t.Errorf("%s: unknown program %q", n.Name, n.Program)
		}
	}
}
