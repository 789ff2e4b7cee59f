package backend

import (
	"encoding/json"
	"testing"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/iptablestest"
)

// The helper gets the ruleset as JSON: it must write exactly what the caller built, for every
// kind of rule (ports, ranges, subnets of both families, redirect-listed ports, close-wait).
func TestHelperRequestCarriesTheRuleset(t *testing.T) {
	c := iptables.NewConfig()
	c.InboundProxyPort, c.OutboundProxyPort, c.ProxyUID, c.ProxyGID = 4143, 4140, 2102, 2103
	c.PortsToRedirect = []string{"80,8080-8090"}
	c.InboundPortsToIgnore = []string{"4190,4191,1000-2000"}
	c.OutboundPortsToIgnore = []string{"443"}
	c.InboundSubnetsToIgnore = []string{"192.0.2.0/24", "2001:db8::/64"}
	c.OutboundSubnetsToIgnore = []string{"198.51.100.0/24", "2001:db8:1::/48"}
	c.CloseWaitSecs = 30
	rs, err := iptables.Build(c)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(helperRequest{Op: opApply, Options: Options{Mode: iptables.ModeNFT, Wait: true}, Rules: rs})
	if err != nil {
		t.Fatal(err)
	}
	var got helperRequest
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.Rules.Hash() != rs.Hash() || iptablestest.NFTScript(got.Rules.NFT()) != iptablestest.NFTScript(rs.NFT()) || got.Rules.CloseWaitSecs != 30 {
		t.Errorf("the ruleset changed on the way:\n%s\nwant\n%s", iptablestest.NFTScript(got.Rules.NFT()), iptablestest.NFTScript(rs.NFT()))
	}
	for _, f := range []iptables.Family{iptables.IPv4, iptables.IPv6} {
		if g, w := iptables.TransitionPayload(iptables.SavedState{}, got.Rules.Saved(f)), iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f)); g != w {
			t.Errorf("%s payload:\n%s\nwant\n%s", f, g, w)
		}
	}
	if got.Options != (Options{Mode: iptables.ModeNFT, Wait: true}) {
		t.Errorf("options %+v", got.Options)
	}
}
