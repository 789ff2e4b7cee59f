package iptables

// DNS capture: DNS over UDP and TCP (to every nameserver, or those of resolv.conf) goes to the
// proxy's DNS port; the raw chains keep captured and direct DNS in conntrack zones of their own.

import (
	"net/netip"
	"slices"
)

// DNSPort is where DNS is captured.
const DNSPort = 53

// Conntrack zones of DNS over UDP: captured queries and the proxy's answers, apart from queries
// that go out as they are and the nameservers' answers. A UDP query and the proxy's forwarded
// copy can have the same addresses and ports, and one zone would mix their NAT.
const (
	ZoneDirect   uint16 = 1
	ZoneCaptured uint16 = 2
)

// dnsRedirectSteps are the outbound chain's steps that capture DNS, over UDP then TCP.
func (r *Ruleset) dnsRedirectSteps() []Step {
	var steps []Step
	for _, proto := range []string{"udp", "tcp"} {
		dns := redirectDNSStep{StepCommon{Name: "redirect-dns-" + proto}, proto, r.DNSServers, r.DNSPort}
		if len(r.DNSServers) > 0 {
			dns.Name += "-"
		}
		steps = append(steps, dns)
	}
	return steps
}

// dnsZoneSteps are the raw chains' steps (output, prerouting) that put DNS into its conntrack
// zones; the first that matches holds.
func (r *Ruleset) dnsZoneSteps(exempts []exemption) (output, prerouting []Step) {
	zone := func(name string, z, sport uint16) dnsZoneStep {
		return dnsZoneStep{StepCommon: StepCommon{Name: name}, Zone: z, SPort: sport}
	}
	for _, e := range exempts {
		s := zone("dns-zone-"+e.name, ZoneDirect, 0)
		s.exemption = e
		output = append(output, s)
	}
	for _, name := range r.IgnoreInterfaces {
		s := zone("dns-zone-interface-"+name, ZoneDirect, 0)
		s.Interface = name
		output = append(output, s)
	}
	output = append(output, zone("dns-zone-proxy-answers", ZoneCaptured, r.DNSPort))
	captured := zone("dns-zone-captured", ZoneCaptured, 0)
	captured.Servers = r.DNSServers
	if len(r.DNSServers) > 0 {
		captured.Name += "-"
	}
	output = append(output, captured)
	if len(r.DNSServers) > 0 {
		output = append(output, zone("dns-zone-not-captured", ZoneDirect, 0))
	}
	return output, []Step{zone("dns-zone-nameserver-answers", ZoneDirect, DNSPort)}
}

// redirectDNSStep redirects DNS over Proto to Servers (every nameserver when empty) to port Port.
type redirectDNSStep struct {
	StepCommon
	Proto   string
	Servers []netip.Addr // of both families
	Port    uint16
}

func (s redirectDNSStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.Target, x.ToPort = TargetRedirect, s.Port
	x.TCP, x.UDP = s.Proto == "tcp", s.Proto == "udp"
	x.DPort = PortRange{First: DNSPort, Last: DNSPort}
	return appendPer(out, x, s, s.Servers, dnsServer(f))
}

func (s redirectDNSStep) nftRules(w *nftWriter) {
	port := NFTMatch{Kind: NFTMatchUDPDPort, ID: DNSPort}
	if s.Proto == "tcp" {
		port.Kind = NFTMatchTCPDPort
	}
	rl := NFTRule{Comment: comment(s, ""), Verdict: NFTRedirect, RedirectPort: s.Port}
	w.perServer(s.StepCommon, s.Servers, rl, w.acting(port))
}

// dnsZoneStep puts DNS packets into conntrack zone Zone: UDP to port 53 (to Servers, when given)
// or, when SPort is set, UDP from that port, from sockets of the exemption's user or group or out
// of the interface Interface, when given.
type dnsZoneStep struct {
	StepCommon
	exemption
	Servers   []netip.Addr
	Interface string
	SPort     uint16
	Zone      uint16
}

func (s dnsZoneStep) xtRules(out []XTRule, x XTRule, f Family) []XTRule {
	x.UDP, x.Target, x.Zone, x.OutInterface = true, TargetCT, s.Zone, s.Interface
	x.UIDOwner, x.GIDOwner = s.uid, s.gid
	if s.SPort != 0 {
		x.SPort = PortRange{First: s.SPort, Last: s.SPort}
	} else {
		x.DPort = PortRange{First: DNSPort, Last: DNSPort}
	}
	return appendPer(out, x, s, s.Servers, dnsServer(f))
}

func (s dnsZoneStep) nftRules(w *nftWriter) {
	ms := s.nftMatches()
	if s.Interface != "" {
		ms = append(ms, NFTMatch{Kind: NFTMatchOIFName, Name: s.Interface})
	}
	if s.SPort != 0 {
		ms = append(ms, NFTMatch{Kind: NFTMatchUDPSPort, ID: uint32(s.SPort)})
	} else {
		ms = append(ms, NFTMatch{Kind: NFTMatchUDPDPort, ID: DNSPort})
	}
	rl := NFTRule{Comment: comment(s, ""), Verdict: NFTZone, Zone: s.Zone}
	w.perServer(s.StepCommon, s.Servers, rl, w.acting(ms...))
}

// dnsServer is appendPer's setter of a nameserver of family f.
func dnsServer(f Family) func(XTRule, netip.Addr) (XTRule, bool) {
	return func(y XTRule, a netip.Addr) (XTRule, bool) {
		y.Destination = netip.PrefixFrom(a, a.BitLen())
		return y, a.Is4() == (f == IPv4)
	}
}

// perServer adds rl with matches ms once, or once per family of the servers listed, to them.
func (w *nftWriter) perServer(c StepCommon, servers []netip.Addr, rl NFTRule, ms []NFTMatch) {
	if len(servers) == 0 {
		rl.Matches = ms
		w.add(rl)
		return
	}
	var hosts []netip.Prefix
	for _, a := range servers {
		hosts = append(hosts, netip.PrefixFrom(a, a.BitLen()))
	}
	w.perFamily("dns_servers", hosts, func(f Family, set string, ps []netip.Prefix) {
		x := rl
		x.Comment = listComment(c, len(ps), func(i int) string { return ps[i].Addr().String() })
		// The address match takes the place of the nfproto match, which it implies.
		x.Matches = append([]NFTMatch{{Kind: NFTMatchDAddrSet, Family: f, Set: set}}, slices.DeleteFunc(slices.Clone(ms), func(m NFTMatch) bool {
			return m.Kind == NFTMatchNFProto
		})...)
		w.add(x)
	})
}
