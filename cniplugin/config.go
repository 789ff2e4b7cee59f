package cniplugin

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/internal/logging"
	"github.com/kubemesh/proxy-init/iptables"
)

// DefaultAPITimeout bounds all Kubernetes API requests of one ADD or CHECK when the config sets
// no kubernetes.timeout.
const DefaultAPITimeout = 10 * time.Second

// NetConf is the parsed linkerd-cni network config: the keys of Linkerd's ConfigMap
// linkerd-cni-config, plus the optional new ones documented in docs/cni-plugin.md.
type NetConf struct {
	types.PluginConf

	// LogLevel is log_level: debug, info, warn or error (Linkerd's trace, warning, fatal and panic
	// are accepted as their nearest slog level). Empty means info.
	LogLevel string
	// LogFile is log_file: when set, log lines are also appended to this file (new key).
	LogFile string
	// ExcludeNamespaces is exclude-namespaces, at the top level and in the kubernetes block
	// (which the installer writes, so that Linkerd's top-level keys stay Linkerd's) together:
	// pods there are passed through without any API call.
	ExcludeNamespaces []string
	// Ceilings are max-close-wait-timeout-secs and max-annotation-list-entries (new keys);
	// absent keys take DefaultCeilings.
	Ceilings Ceilings
	// StateDir is state-dir (new key): the node directory, root's alone, of the namespaces' lock
	// files and the pods' records (record.go); absent means DefaultStateDir.
	StateDir string

	Kubernetes Kubernetes
	Linkerd    Linkerd
	Agent      Agent

	// baseRules are Linkerd's rules before any annotation, built while validating: what an
	// unmeshed pod's CHECK reads back against.
	baseRules *iptables.Ruleset
}

// Kubernetes is the "kubernetes" block.
type Kubernetes struct {
	// Kubeconfig is kubernetes.kubeconfig, the file the installer writes.
	Kubeconfig string
	// APIRoot is kubernetes.k8s_api_root; when set it replaces the kubeconfig's server URL.
	APIRoot string
	// Timeout is kubernetes.timeout (new key, a Go duration), the bound on all API requests of
	// one ADD or CHECK. Zero means DefaultAPITimeout.
	Timeout time.Duration
	// StatusUnauthorizedAfter is kubernetes.status-unauthorized-after (new key, a Go duration):
	// how long the API server may refuse the plugin's credentials before STATUS fails
	// (refused.go). Zero means DefaultStatusUnauthorizedAfter.
	StatusUnauthorizedAfter time.Duration
	// KubeletPodsSocket is kubernetes.kubelet-pods-socket (new key): the kubelet's pods API
	// socket (kubelet.go). Absent means DefaultKubeletPodsSocket; "" never asks the kubelet.
	KubeletPodsSocket string
}

// Agent is the "agent" block (new): where the node agent answers (agentclient.go).
type Agent struct {
	// Socket is agent.socket: the agent's UNIX socket; absent means DefaultAgentSocket, "" never
	// asks the agent.
	Socket string
	// Timeout is agent.timeout (a Go duration): how long one call waits for the agent's answer
	// before doing the work itself; zero means DefaultAgentTimeout.
	Timeout time.Duration
}

// Linkerd is the "linkerd" block: the rule builder's config, each key the proxy-init flag of the
// same name (iptables-mode is Mode; empty means legacy, as in Linkerd; ipv6 is true, false or, new,
// "auto": IPv6Auto), and the plugin's own two keys. iptables.Build only reads its lists and Merge
// copies them before it changes them, so one Linkerd serves concurrent calls (the agent's writes).
type Linkerd struct {
	iptables.Config
	Simulate    bool
	UseWaitFlag bool
}

// APITimeout is the effective bound on the API requests of one command.
func (c *NetConf) APITimeout() time.Duration {
	return cmp.Or(c.Kubernetes.Timeout, DefaultAPITimeout)
}

// Excluded reports whether pods of namespace ns are passed through without a lookup.
func (c *NetConf) Excluded(ns string) bool { return slices.Contains(c.ExcludeNamespaces, ns) }

// ParseConfig decodes a network config and its prevResult and validates every key. All problems
// are reported at once as a *badinput.Error, each naming the JSON key with its block (e.g.
// "linkerd.proxy-uid") and the value; JSON that does not decode at all is a plain error. Omitted
// values take Linkerd's meaning: proxy-uid and proxy-gid -1 (no exemption), iptables-mode legacy.
func ParseConfig(data []byte) (*NetConf, error) {
	conf, probs, err := decodeConfig(data, true)
	if err != nil {
		return nil, err
	}
	probs = append(probs, conf.validate()...)
	if len(probs) > 0 {
		return nil, &badinput.Error{What: "invalid linkerd-cni network config", Problems: probs}
	}
	return conf, nil
}

// ParseConfigLenient is ParseConfig for DEL: it decodes what it can and ignores invalid values,
// because DEL must never fail on a config that ADD would have refused. Only JSON that does not
// decode at all is an error.
func ParseConfigLenient(data []byte) (*NetConf, error) {
	conf, _, err := decodeConfig(data, false)
	return conf, err
}

func decodeConfig(data []byte, strict bool) (*NetConf, []badinput.Problem, error) {
	def := iptables.NewConfig() // the -1s: unset ports, no UID or GID exemption
	conf := &NetConf{Linkerd: Linkerd{Config: iptables.Config{InboundProxyPort: def.InboundProxyPort, OutboundProxyPort: def.OutboundProxyPort, ProxyUID: def.ProxyUID, ProxyGID: def.ProxyGID}}}
	// prevResult goes straight into its result type. CNI's ParsePrevResult, which goes through a
	// map and back to JSON (0.1 ms of the plugin's cold start), decodes what that refuses, with its
	// errors: a result without its version (before CNI 1.0), null, or not a result at all.
	var pc struct {
		types.PluginConf
		Prev json.RawMessage `json:"prevResult"`
	}
	err := json.Unmarshal(data, &pc)
	if err == nil && pc.Prev != nil {
		pc.PrevResult, err = create.Create(pc.CNIVersion, pc.Prev)
	}
	conf.PluginConf = pc.PluginConf
	if err != nil {
		if err := json.Unmarshal(data, &conf.PluginConf); err != nil {
			return nil, nil, fmt.Errorf("parse linkerd-cni network config: %w", err)
		}
		err = version.ParsePrevResult(&conf.PluginConf)
	}
	var top map[string]json.RawMessage
	_ = json.Unmarshal(data, &top) // the object that decoded into PluginConf
	if err != nil {
		if strict {
			return nil, nil, fmt.Errorf("parse prevResult of the linkerd-cni network config: %w", err)
		}
		conf.PrevResult = nil
	}

	d := &decoder{}
	d.topLevel(top, conf, strict)
	d.kubernetesAndAgent(top, conf)
	d.linkerd(d.object(top, "", "linkerd"), &conf.Linkerd)
	return conf, d.probs, nil
}

// topLevel decodes the keys beside the nested objects: logging, exclusions, the ceilings on what
// annotations may ask for and the state directory.
func (d *decoder) topLevel(top map[string]json.RawMessage, conf *NetConf, strict bool) {
	d.get(top, "", "log_level", &conf.LogLevel, "a string")
	d.get(top, "", "log_file", &conf.LogFile, "a string")
	d.get(top, "", "exclude-namespaces", &conf.ExcludeNamespaces, "a list of namespace names")
	conf.Ceilings = DefaultCeilings
	d.get(top, "", "max-close-wait-timeout-secs", &conf.Ceilings.MaxCloseWaitSecs, "an integer")
	d.get(top, "", "max-annotation-list-entries", &conf.Ceilings.MaxListEntries, "an integer")
	conf.StateDir = DefaultStateDir
	if d.get(top, "", "state-dir", &conf.StateDir, "a string") && !strict && !filepath.IsAbs(conf.StateDir) {
		conf.StateDir = DefaultStateDir // ADD refused it, so nothing of the pod's is elsewhere
	}
	// "policy" (Calico-era) and "runtimeConfig" are accepted and ignored, as Linkerd does.
}

// kubernetesAndAgent decodes where the plugin reads pods from: the API (kubernetes), the kubelet
// and the node agent.
func (d *decoder) kubernetesAndAgent(top map[string]json.RawMessage, conf *NetConf) {
	k8s := d.object(top, "", "kubernetes")
	d.get(k8s, "kubernetes.", "kubeconfig", &conf.Kubernetes.Kubeconfig, "a string")
	d.get(k8s, "kubernetes.", "k8s_api_root", &conf.Kubernetes.APIRoot, "a string")
	var k8sExcluded []string
	if d.get(k8s, "kubernetes.", "exclude-namespaces", &k8sExcluded, "a list of namespace names") {
		conf.ExcludeNamespaces = append(conf.ExcludeNamespaces, k8sExcluded...)
	}
	d.duration(k8s, "kubernetes.", "timeout", &conf.Kubernetes.Timeout, "5s")
	d.duration(k8s, "kubernetes.", "status-unauthorized-after", &conf.Kubernetes.StatusUnauthorizedAfter, "5m")
	conf.Kubernetes.KubeletPodsSocket = DefaultKubeletPodsSocket
	d.get(k8s, "kubernetes.", "kubelet-pods-socket", &conf.Kubernetes.KubeletPodsSocket, "a string")

	conf.Agent.Socket = DefaultAgentSocket
	ag := d.object(top, "", "agent")
	d.get(ag, "agent.", "socket", &conf.Agent.Socket, "a string")
	d.duration(ag, "agent.", "timeout", &conf.Agent.Timeout, "3s")
}

// linkerd decodes the linkerd object: Linkerd's own keys, then the features beyond them.
func (d *decoder) linkerd(ld map[string]json.RawMessage, l *Linkerd) {
	const lp = "linkerd."
	d.get(ld, lp, iptables.FieldInboundProxyPort, &l.InboundProxyPort, "an integer")
	d.get(ld, lp, iptables.FieldOutboundProxyPort, &l.OutboundProxyPort, "an integer")
	d.get(ld, lp, iptables.FieldProxyUID, &l.ProxyUID, "an integer")
	d.get(ld, lp, iptables.FieldProxyGID, &l.ProxyGID, "an integer")
	d.ports(ld, lp, iptables.FieldPortsToRedirect, &l.PortsToRedirect)
	d.ports(ld, lp, iptables.FieldInboundPortsToIgnore, &l.InboundPortsToIgnore)
	d.ports(ld, lp, iptables.FieldOutboundPortsToIgnore, &l.OutboundPortsToIgnore)
	d.get(ld, lp, iptables.FieldInboundSubnetsToIgnore, &l.InboundSubnetsToIgnore, "a list of CIDR strings")
	d.get(ld, lp, iptables.FieldOutboundSubnetsToIgnore, &l.OutboundSubnetsToIgnore, "a list of CIDR strings")
	d.get(ld, lp, "simulate", &l.Simulate, "true or false")
	d.get(ld, lp, "use-wait-flag", &l.UseWaitFlag, "true or false")
	d.get(ld, lp, iptables.FieldMode, &l.Mode, "a string")
	l.Mode = cmp.Or(l.Mode, iptables.ModeLegacy)
	if raw, ok := ld["ipv6"]; ok { // a JSON boolean, as Linkerd has it, or (new) the string "auto"
		var s string
		if json.Unmarshal(raw, &s) == nil && s == "auto" {
			l.IPv6Auto = true
		} else if err := json.Unmarshal(raw, &l.IPv6); err != nil {
			d.bad(lp+"ipv6", compact(raw), `want true, false or "auto"`)
		}
	}

	// The features beyond Linkerd's.
	d.get(ld, lp, iptables.FieldRedirectDNS, &l.RedirectDNSToPort, "an integer")
	var serversOnly bool
	if d.get(ld, lp, iptables.FieldDNSServersOnly, &serversOnly, "true or false") && serversOnly {
		d.bad(lp+iptables.FieldDNSServersOnly, "true", "not offered by the CNI plugin: it runs before the pod's /etc/resolv.conf exists and would read the node's; "+
			"leave it out to capture DNS to every nameserver, or set it on proxy-init as an init container")
	}
	d.get(ld, lp, iptables.FieldInboundMode, &l.InboundMode, "a string")
	d.ports(ld, lp, iptables.FieldOutboundPortsToRedirect, &l.OutboundPortsToRedirect)
	d.get(ld, lp, iptables.FieldOutboundSubnetsToRedirect, &l.OutboundSubnetsToRedirect, "a list of CIDR strings")
	d.get(ld, lp, iptables.FieldInterfacesToIgnore, &l.InterfacesToIgnore, "a list of interface names")
	d.ids(ld, lp, iptables.FieldUIDsToIgnore, &l.UIDsToIgnore)
	d.ids(ld, lp, iptables.FieldGIDsToIgnore, &l.GIDsToIgnore)
	d.get(ld, lp, iptables.FieldDropInvalid, &l.DropInvalid, "true or false")
	d.get(ld, lp, iptables.FieldRerouteVirtualInterfaces, &l.RerouteVirtualInterfaces, "a list of interface names")
}

// validate checks the values that decoded, with the rule builder's checks on the linkerd block.
func (c *NetConf) validate() []badinput.Problem {
	d := &decoder{}
	bad := d.bad
	// An absent key is info, which is also what logging.ParseLevel gives for a name it refuses.
	if _, err := logging.ParseLevel(c.LogLevel); err != nil && strings.TrimSpace(c.LogLevel) != "" {
		bad("log_level", c.LogLevel, "want trace, debug, info, warn or error")
	}
	for _, ns := range c.ExcludeNamespaces {
		if strings.TrimSpace(ns) == "" {
			bad("exclude-namespaces", ns, "empty namespace name")
		}
	}
	if c.Ceilings.MaxCloseWaitSecs < 1 {
		bad("max-close-wait-timeout-secs", strconv.FormatInt(c.Ceilings.MaxCloseWaitSecs, 10), "must be at least 1")
	}
	if c.Ceilings.MaxListEntries < 1 {
		bad("max-annotation-list-entries", strconv.Itoa(c.Ceilings.MaxListEntries), "must be at least 1")
	}
	if !filepath.IsAbs(c.StateDir) {
		bad("state-dir", c.StateDir, "not an absolute path")
	}
	if s := c.Agent.Socket; s != "" && !filepath.IsAbs(s) {
		bad("agent.socket", s, "not an absolute path")
	}
	if s := c.Kubernetes.KubeletPodsSocket; s != "" && !filepath.IsAbs(s) {
		bad("kubernetes.kubelet-pods-socket", s, "not an absolute path")
	}
	if c.Kubernetes.Kubeconfig == "" {
		bad("kubernetes.kubeconfig", "", "must be set: the plugin reads the pod from the Kubernetes API with it")
	}
	rs, err := iptables.Build(c.Linkerd.Config)
	if v, ok := badinput.As(err); ok {
		for _, p := range v.Problems {
			p.Field = "linkerd." + p.Field
			d.probs = append(d.probs, p)
		}
	}
	c.baseRules = rs
	return d.probs
}

// decoder decodes one key at a time so that a type error names the key and shows the value.
type decoder struct {
	probs []badinput.Problem
}

func (d *decoder) bad(field, value, reason string) {
	d.probs = append(d.probs, badinput.Problem{Field: field, Value: value, Reason: reason})
}

// get decodes obj[key] into dst and reports whether the key was present and decoded. A JSON null
// leaves dst unchanged.
func (d *decoder) get(obj map[string]json.RawMessage, prefix, key string, dst any, want string) bool {
	raw, ok := obj[key]
	if !ok {
		return false
	}
	if err := json.Unmarshal(raw, dst); err != nil {
		d.bad(prefix+key, compact(raw), "want "+want)
		return false
	}
	return true
}

// duration decodes obj[key], a positive Go duration string such as example, into dst.
func (d *decoder) duration(obj map[string]json.RawMessage, prefix, key string, dst *time.Duration, example string) {
	var v string
	if !d.get(obj, prefix, key, &v, "a duration string such as \""+example+"\"") || v == "" {
		return
	}
	t, err := time.ParseDuration(v)
	switch {
	case err != nil:
		d.bad(prefix+key, v, "want a duration such as \""+example+"\"")
	case t <= 0:
		d.bad(prefix+key, v, "must be positive")
	default:
		*dst = t
	}
}

// object decodes obj[key] as a JSON object; absent or null is an empty object.
func (d *decoder) object(obj map[string]json.RawMessage, prefix, key string) map[string]json.RawMessage {
	var out map[string]json.RawMessage
	d.get(obj, prefix, key, &out, "an object")
	return out
}

// ports decodes a port list. Linkerd's config has strings for the ignore lists and integers for
// ports-to-redirect; both spellings are accepted everywhere, as is one comma-separated string.
func (d *decoder) ports(obj map[string]json.RawMessage, prefix, key string, dst *[]string) {
	d.numbers(obj, prefix, key, dst, "a list of ports (numbers or strings such as \"4190\" or \"1000-2000\")",
		"not an integer port", "a port number or a string such as \"1000-2000\"")
}

// ids decodes a list of user or group IDs, spelled as the port lists may be.
func (d *decoder) ids(obj map[string]json.RawMessage, prefix, key string, dst *[]string) {
	d.numbers(obj, prefix, key, dst, "a list of IDs (numbers or strings)", "not an integer ID", "an ID, a number or a string")
}

// numbers decodes a list of integers or strings (the rule builder checks the strings), or one
// comma-separated string; wantList, notInteger and wantItem are the messages.
func (d *decoder) numbers(obj map[string]json.RawMessage, prefix, key string, dst *[]string, wantList, notInteger, wantItem string) {
	raw, ok := obj[key]
	if !ok {
		return
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one != "" {
			*dst = []string{one}
		}
		return
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		d.bad(prefix+key, compact(raw), "want "+wantList)
		return
	}
	out := []string{}
	for _, it := range items {
		var s string
		var n json.Number
		switch {
		case json.Unmarshal(it, &s) == nil:
			out = append(out, s)
		case json.Unmarshal(it, &n) == nil:
			if _, err := strconv.Atoi(n.String()); err != nil {
				d.bad(prefix+key, n.String(), notInteger)
				continue
			}
			out = append(out, n.String())
		default:
			d.bad(prefix+key, compact(it), "want "+wantItem)
		}
	}
	*dst = out
}

// compact renders a JSON value for a message: strings without their quotes (the message quotes
// them), anything else in compact JSON.
func compact(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return string(raw)
	}
	return b.String()
}
