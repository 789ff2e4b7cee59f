package iptables

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kubemesh/proxy-init/internal/badinput"
)

// Mode selects how rules are written. The names are the values of --iptables-mode.
type Mode string

const (
	// ModeAuto writes with the first backend the kernel accepts: iptables-nft's rules over
	// netlink, then native nftables, then iptables-legacy.
	ModeAuto   Mode = "auto"
	ModeLegacy Mode = "legacy" // the iptables-legacy binaries
	// ModeNFT writes iptables-nft's rules (Linkerd's "nft"): over netlink, or with the
	// iptables-nft binaries where the kernel refuses that.
	ModeNFT      Mode = "nft"
	ModePlain    Mode = "plain"    // whatever the plain "iptables" binaries are
	ModeNFTables Mode = "nftables" // nftables over netlink, with no binaries at all
)

// Modes lists every valid mode, in the order they are documented.
var Modes = []Mode{ModeAuto, ModeLegacy, ModeNFT, ModePlain, ModeNFTables}

// Field names of validation errors: the proxy-init flag names, also the keys of the CNI network
// config's "linkerd" block, so one message serves both front ends.
const (
	FieldInboundProxyPort        = "incoming-proxy-port"
	FieldOutboundProxyPort       = "outgoing-proxy-port"
	FieldProxyUID                = "proxy-uid"
	FieldProxyGID                = "proxy-gid"
	FieldPortsToRedirect         = "ports-to-redirect"
	FieldInboundPortsToIgnore    = "inbound-ports-to-ignore"
	FieldOutboundPortsToIgnore   = "outbound-ports-to-ignore"
	FieldInboundSubnetsToIgnore  = "subnets-to-ignore"
	FieldOutboundSubnetsToIgnore = "outbound-subnets-to-ignore"
	FieldMode                    = "iptables-mode"
	FieldCloseWait               = "timeout-close-wait-secs"
	FieldIPv6                    = "ipv6"

	// The redirect features beyond Linkerd's (the other meshes' features).
	FieldRedirectDNS               = "redirect-dns-to-port"
	FieldDNSServersOnly            = "dns-servers-only"
	FieldInboundMode               = "inbound-mode"
	FieldOutboundPortsToRedirect   = "outbound-ports-to-redirect"
	FieldOutboundSubnetsToRedirect = "outbound-subnets-to-redirect"
	FieldInterfacesToIgnore        = "interfaces-to-ignore"
	FieldUIDsToIgnore              = "uids-to-ignore"
	FieldGIDsToIgnore              = "gids-to-ignore"
	FieldDropInvalid               = "drop-invalid"
	FieldRerouteVirtualInterfaces  = "reroute-virtual-interfaces"
)

// InboundMode is how inbound TCP reaches the proxy: the values of --inbound-mode.
type InboundMode string

const (
	// InboundRedirect rewrites the destination to the proxy's port (nat REDIRECT): the proxy
	// asks for the original destination with SO_ORIGINAL_DST. Linkerd's only mode.
	InboundRedirect InboundMode = "redirect"
	// InboundTPROXY hands the connection unchanged to the proxy's transparent socket (TPROXY, a
	// mark and a policy route), whose local address is the original destination.
	InboundTPROXY InboundMode = "tproxy"
)

// MaxID is the largest user or group ID: 2^32-1 is (uid_t)-1, which no socket owner has.
const MaxID = 1<<32 - 2

// MaxCloseWaitSecs is the longest conntrack CLOSE_WAIT timeout every kernel accepts: it keeps it
// in jiffies in an int, so INT_MAX/HZ seconds, and HZ is at most 1000.
const MaxCloseWaitSecs = (1<<31 - 1) / 1000

// Config is what the user asked for, in the user's own terms (port lists as typed: "4190,4191",
// "1000-2000"), so that Build can name the exact offending value.
type Config struct {
	InboundProxyPort  int
	OutboundProxyPort int
	// ProxyUID and ProxyGID exempt the proxy's own outbound traffic; -1 means no exemption.
	ProxyUID int
	ProxyGID int
	// PortsToRedirect, when non-empty, switches inbound to "redirect-listed" mode.
	PortsToRedirect       []string
	InboundPortsToIgnore  []string
	OutboundPortsToIgnore []string
	// InboundSubnetsToIgnore skips the proxy by source address (Linkerd's --subnets-to-ignore).
	InboundSubnetsToIgnore []string
	// OutboundSubnetsToIgnore skips the proxy by destination address.
	OutboundSubnetsToIgnore []string
	// IPv6 also writes rules for IPv6; IPv4 rules are always written.
	IPv6 bool
	// Mode is the backend; empty means ModeAuto.
	Mode Mode
	// CloseWaitSecs, when positive, is the conntrack CLOSE_WAIT timeout to set in the namespace
	// (nf_conntrack_tcp_timeout_close_wait); 0 leaves the kernel's.
	CloseWaitSecs int64

	// IPv6Auto writes IPv6 rules only if the namespace has IPv6 beyond loopback and link-local,
	// decided where the rules are written (Ruleset.ForIPv6); IPv6 is then ignored.
	IPv6Auto bool
	// RedirectDNSToPort, when positive, sends the pod's DNS (UDP and TCP to port 53) to this
	// port on loopback, except the exempt users' and groups'; 0 captures none.
	RedirectDNSToPort int
	// DNSServersOnly limits DNS capture to DNSServers, the nameservers of /etc/resolv.conf.
	DNSServersOnly bool
	DNSServers     []string
	// InboundMode is redirect (or empty) or tproxy.
	InboundMode InboundMode
	// OutboundPortsToRedirect and OutboundSubnetsToRedirect, when given, limit outbound
	// redirection to these ports and destinations (both must match); the ignore lists still win.
	OutboundPortsToRedirect   []string
	OutboundSubnetsToRedirect []string
	// InterfacesToIgnore are interfaces whose traffic, in or out, is never redirected.
	InterfacesToIgnore []string
	// UIDsToIgnore and GIDsToIgnore exempt more users and groups (comma lists of IDs, as typed).
	UIDsToIgnore []string
	GIDsToIgnore []string
	// DropInvalid drops inbound TCP that conntrack marks INVALID.
	DropInvalid bool
	// RerouteVirtualInterfaces are the interfaces of a virtual machine the pod runs (KubeVirt's):
	// TCP arriving on them is the VM's outbound traffic, which goes to the outbound proxy port.
	RerouteVirtualInterfaces []string
}

// NewConfig returns a Config with proxy-init's defaults: ports unset, no UID or GID exemption,
// IPv6 on and automatic backend selection.
func NewConfig() Config {
	return Config{InboundProxyPort: -1, OutboundProxyPort: -1, ProxyUID: -1, ProxyGID: -1, IPv6: true, Mode: ModeAuto}
}

// PortRange is an inclusive range of TCP ports; a single port has First == Last.
type PortRange struct {
	First, Last uint16
}

// String renders the range the way the user writes it: "80" or "1000-2000".
func (r PortRange) String() string {
	if r.First == r.Last {
		return strconv.Itoa(int(r.First))
	}
	return fmt.Sprintf("%d-%d", r.First, r.Last)
}

// ParsePort parses one port ("8080") or range ("1000-2000"), each end within 1-65535.
func ParsePort(s string) (PortRange, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return PortRange{}, errors.New("empty port")
	}
	lo, hi, isRange := strings.Cut(s, "-")
	if lo == "" {
		// "-5": a negative number, or a range with no start; either way not a port.
		return PortRange{}, fmt.Errorf("%q is not a port number or a range a-b", s)
	}
	if !isRange {
		hi = lo
	}
	first, errFirst := parsePortNumber(lo)
	last, errLast := parsePortNumber(hi)
	if err := cmp.Or(errFirst, errLast); err != nil {
		return PortRange{}, err
	}
	if last < first {
		return PortRange{}, fmt.Errorf("range %d-%d is reversed", first, last)
	}
	return PortRange{first, last}, nil
}

func parsePortNumber(s string) (uint16, error) {
	s = strings.TrimSpace(s)
	n, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a port number", s)
	}
	if n < 1 || n > 65535 {
		return 0, fmt.Errorf("port %d is outside 1-65535", n)
	}
	return uint16(n), nil
}

// ParseCIDR parses a subnet ("10.0.0.0/8", "fd00::/8") or a bare address, taken as a single host.
// Host bits are cleared, as iptables would.
func ParseCIDR(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Prefix{}, errors.New("empty subnet")
	}
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, fmt.Errorf("%q is not a CIDR or an IP address", s)
		}
		if a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("%q has a zone, which a subnet cannot have", s)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not a valid CIDR", s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%q is an IPv4-mapped IPv6 subnet; write the IPv4 subnet", s)
	}
	return p.Masked(), nil
}

// Build validates c as a whole and returns the normalized Ruleset it describes. Every problem is
// reported at once, as a *badinput.Error whose fields are the Field* names.
func Build(c Config) (*Ruleset, error) {
	var probs []badinput.Problem
	bad := func(field, value, reason string) {
		probs = append(probs, badinput.Problem{Field: field, Value: value, Reason: reason})
	}
	rs := &Ruleset{
		InboundProxyPort:      proxyPort(bad, FieldInboundProxyPort, c.InboundProxyPort),
		OutboundProxyPort:     proxyPort(bad, FieldOutboundProxyPort, c.OutboundProxyPort),
		ProxyUID:              c.ProxyUID,
		ProxyGID:              c.ProxyGID,
		RedirectPorts:         portList(bad, FieldPortsToRedirect, c.PortsToRedirect),
		InboundIgnorePorts:    portList(bad, FieldInboundPortsToIgnore, c.InboundPortsToIgnore),
		OutboundIgnorePorts:   portList(bad, FieldOutboundPortsToIgnore, c.OutboundPortsToIgnore),
		InboundIgnoreSubnets:  subnetList(bad, FieldInboundSubnetsToIgnore, c.InboundSubnetsToIgnore),
		OutboundIgnoreSubnets: subnetList(bad, FieldOutboundSubnetsToIgnore, c.OutboundSubnetsToIgnore),
		Families:              []Family{IPv4},
		CloseWaitSecs:         c.CloseWaitSecs,
		IPv6Auto:              c.IPv6Auto,
		DropInvalid:           c.DropInvalid,
		TPROXY:                c.InboundMode == InboundTPROXY,
		saved:                 new(savedCache),
	}
	proxyID(bad, FieldProxyUID, "UID", c.ProxyUID)
	proxyID(bad, FieldProxyGID, "GID", c.ProxyGID)
	if c.IPv6 || c.IPv6Auto {
		rs.Families = append(rs.Families, IPv6)
	}
	if c.Mode != "" && !slices.Contains(Modes, c.Mode) {
		bad(FieldMode, string(c.Mode), "unknown mode; want one of "+strings.Join(strs(Modes), ", "))
	}
	if c.CloseWaitSecs < 0 || c.CloseWaitSecs > MaxCloseWaitSecs {
		bad(FieldCloseWait, strconv.FormatInt(c.CloseWaitSecs, 10),
			fmt.Sprintf("must be 0 (leave the kernel's) or 1 to %d seconds, the most every kernel accepts", MaxCloseWaitSecs))
	}
	if !slices.Contains([]InboundMode{"", InboundRedirect, InboundTPROXY}, c.InboundMode) {
		bad(FieldInboundMode, string(c.InboundMode), "unknown inbound mode; want redirect or tproxy")
	}
	rs.OutboundRedirectPorts = portList(bad, FieldOutboundPortsToRedirect, c.OutboundPortsToRedirect)
	rs.OutboundRedirectSubnets = subnetList(bad, FieldOutboundSubnetsToRedirect, c.OutboundSubnetsToRedirect)
	rs.IgnoreInterfaces = interfaces(bad, FieldInterfacesToIgnore, c.InterfacesToIgnore)
	rs.RerouteInterfaces = rerouteInterfaces(bad, c.RerouteVirtualInterfaces, rs.IgnoreInterfaces)
	rs.IgnoreUIDs = ids(bad, FieldUIDsToIgnore, "UID", c.UIDsToIgnore, c.ProxyUID)
	rs.IgnoreGIDs = ids(bad, FieldGIDsToIgnore, "GID", c.GIDsToIgnore, c.ProxyGID)
	rs.DNSPort, rs.DNSServers = dnsCapture(bad, c)
	if len(probs) > 0 {
		return nil, &badinput.Error{What: "invalid configuration", Problems: probs}
	}
	return rs, nil
}

// proxyPort checks one of the proxy's ports, which must be set (-1 is unset).
func proxyPort(bad func(field, value, reason string), field string, v int) uint16 {
	switch {
	case v == -1:
		bad(field, strconv.Itoa(v), "must be set")
	case v < 1 || v > 65535:
		bad(field, strconv.Itoa(v), "port is outside 1-65535")
	default:
		return uint16(v)
	}
	return 0
}

// proxyID checks the proxy's UID or GID (what), which is exempt from redirection: -1 for none.
func proxyID(bad func(field, value, reason string), field, what string, v int) {
	switch {
	case v == 0:
		bad(field, "0", "refusing to exempt "+what+" 0 (root): use -1 for no exemption")
	case v < -1 || v > MaxID:
		// Above MaxID a 32-bit ID wraps: 2^32 would exempt root.
		bad(field, strconv.Itoa(v), fmt.Sprintf("must be -1 (none) or a %s from 1 to %d", what, MaxID))
	}
}

// eachItem calls fn with each item of values' comma-separated lists, trimmed. An empty value is
// no item; an empty item in a list is passed on, for fn to report.
func eachItem(values []string, fn func(item string)) {
	for _, v := range values {
		if strings.TrimSpace(v) == "" {
			continue
		}
		for _, part := range strings.Split(v, ",") {
			fn(strings.TrimSpace(part))
		}
	}
}

// portList parses the ports and ranges of field, keeping the first of each in order.
func portList(bad func(field, value, reason string), field string, values []string) []PortRange {
	var out []PortRange
	seen := map[PortRange]bool{}
	eachItem(values, func(part string) {
		if r, err := ParsePort(part); err != nil {
			bad(field, part, err.Error())
		} else if !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
	})
	return out
}

// subnetList parses the CIDRs of field as portList does ports, without duplicates.
func subnetList(bad func(field, value, reason string), field string, values []string) []netip.Prefix {
	n := 0
	for _, v := range values {
		n += strings.Count(v, ",") + 1
	}
	out := make([]netip.Prefix, 0, n)
	eachItem(values, func(part string) {
		if p, err := ParseCIDR(part); err != nil {
			bad(field, part, err.Error())
		} else {
			out = append(out, p)
		}
	})
	return dedupePrefixes(out)
}

// dnsCapture checks the DNS redirect port (0: no capture) and the nameservers it is limited to.
func dnsCapture(bad func(field, value, reason string), c Config) (uint16, []netip.Addr) {
	switch v := c.RedirectDNSToPort; {
	case v == 0:
		if c.DNSServersOnly {
			bad(FieldDNSServersOnly, "true", "needs --"+FieldRedirectDNS+": it limits DNS capture, which is off")
		}
	case v < 0 || v > 65535:
		bad(FieldRedirectDNS, strconv.Itoa(v), "port is outside 1-65535 (0: capture no DNS)")
	case v == c.InboundProxyPort || v == c.OutboundProxyPort:
		bad(FieldRedirectDNS, strconv.Itoa(v), "is one of the proxy's TCP ports; DNS over TCP would reach that listener")
	default:
		if c.DNSServersOnly {
			return uint16(v), nameservers(bad, c.DNSServers)
		}
		return uint16(v), nil
	}
	return 0, nil
}

// interfaces checks the interface names of field by the kernel's rules (dev_valid_name) and what
// iptables can spell, keeping the first of each in order.
func interfaces(bad func(field, value, reason string), field string, values []string) []string {
	var out []string
	eachItem(values, func(name string) {
		if reason := badInterfaceName(name); reason != "" {
			bad(field, name, reason)
		} else if !slices.Contains(out, name) {
			out = append(out, name)
		}
	})
	return out
}

// rerouteInterfaces checks the virtual machines' interfaces: neither loopback nor ignored ones.
func rerouteInterfaces(bad func(field, value, reason string), values, ignored []string) []string {
	var out []string
	for _, name := range interfaces(bad, FieldRerouteVirtualInterfaces, values) {
		switch {
		case name == "lo":
			// The pod's own connections, the proxy's included, arrive on lo.
			bad(FieldRerouteVirtualInterfaces, name, "the pod's own traffic, the proxy's included, arrives on it, not a virtual machine's")
		case slices.Contains(ignored, name):
			bad(FieldRerouteVirtualInterfaces, name, "also in "+FieldInterfacesToIgnore+": its traffic cannot both skip the proxy and reach it")
		default:
			out = append(out, name)
		}
	}
	return out
}

// MaxInterfaceName is the longest interface name the kernel takes: IFNAMSIZ less its NUL.
const MaxInterfaceName = 15

func badInterfaceName(name string) string {
	switch {
	case name == "":
		return "empty interface name"
	case len(name) > MaxInterfaceName:
		return fmt.Sprintf("longer than %d bytes, the kernel's limit for an interface name", MaxInterfaceName)
	case name == "." || name == "..":
		return "not a valid interface name"
	case strings.HasSuffix(name, "+"):
		return "a trailing '+' is iptables' wildcard; name each interface in full"
	}
	for _, r := range name {
		switch {
		case r == '/' || r == ':' || r == ' ' || r >= '\t' && r <= '\r':
			return fmt.Sprintf("holds %q, which the kernel refuses in an interface name", r)
		case r < '!' || r > '~' || r == '"' || r == '\'' || r == '\\':
			return fmt.Sprintf("holds %q, which iptables cannot match in an interface name", r)
		}
	}
	return ""
}

// ids parses a list of user or group IDs, each 1 to MaxID, dropping repeats and the one the
// proxy's own ID (proxy) already exempts.
func ids(bad func(field, value, reason string), field, what string, values []string, proxy int) []uint32 {
	var out []uint32
	eachItem(values, func(part string) {
		n, err := strconv.ParseInt(part, 10, 64)
		switch {
		case err != nil:
			bad(field, part, "not a "+what+" (an integer)")
		case n == 0:
			bad(field, part, "refusing to exempt "+what+" 0 (root)")
		case n < 1 || n > MaxID:
			bad(field, part, fmt.Sprintf("must be a %s from 1 to %d", what, MaxID))
		case int(n) != proxy && !slices.Contains(out, uint32(n)):
			out = append(out, uint32(n))
		}
	})
	return out
}

// nameservers parses the nameservers DNS capture is limited to; a zone (fe80::1%eth0) is dropped,
// as an address match cannot hold one.
func nameservers(bad func(field, value, reason string), values []string) []netip.Addr {
	var out []netip.Addr
	for _, v := range values {
		a, err := netip.ParseAddr(strings.TrimSpace(v))
		if err != nil {
			bad(FieldDNSServersOnly, v, "a nameserver of /etc/resolv.conf that is not an IP address")
			continue
		}
		a = a.WithZone("").Unmap()
		if !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	if len(values) == 0 {
		bad(FieldDNSServersOnly, "true", "/etc/resolv.conf names no nameserver to limit DNS capture to")
	}
	return out
}

// dedupePrefixes drops repeated prefixes in place, keeping the first of each. It looks each up in a
// sorted copy: a map of a thousand prefixes touches far more pages, which a fresh process pays for.
func dedupePrefixes(ps []netip.Prefix) []netip.Prefix {
	sorted := slices.Clone(ps)
	slices.SortFunc(sorted, netip.Prefix.Compare)
	// seen[i]: the prefix at sorted[i], the first of its run, is kept already.
	seen := make([]bool, len(ps))
	out := ps[:0]
	for _, p := range ps {
		if i, _ := slices.BinarySearchFunc(sorted, p, netip.Prefix.Compare); !seen[i] {
			seen[i] = true
			out = append(out, p)
		}
	}
	return out
}
