package cniplugin

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kubemesh/proxy-init/internal/badinput"
	"github.com/kubemesh/proxy-init/iptables"
)

// Names Linkerd users and the proxy injector rely on.
const (
	ProxyContainerName = "linkerd-proxy"
	InitContainerName  = "linkerd-init"

	// LabelControlPlaneComponent marks Linkerd's own control-plane pods, which also skip the
	// Kubernetes API server's ports.
	LabelControlPlaneComponent = "linkerd.io/control-plane-component"

	AnnotationSkipOutboundPorts = "config.linkerd.io/skip-outbound-ports"
	AnnotationSkipInboundPorts  = "config.linkerd.io/skip-inbound-ports"
	AnnotationSkipSubnets       = "config.linkerd.io/skip-subnets"
	// The directional subnet skips of linkerd2-proxy-init#792 and linkerd2#15496: inbound
	// source subnets (what skip-subnets means) and outbound destination subnets.
	AnnotationSkipInboundSubnets  = "config.linkerd.io/skip-inbound-subnets"
	AnnotationSkipOutboundSubnets = "config.linkerd.io/skip-outbound-subnets"
	AnnotationProxyUID            = "config.linkerd.io/proxy-uid"
	AnnotationProxyGID            = "config.linkerd.io/proxy-gid"
	AnnotationInboundPort         = "config.linkerd.io/inbound-port"
	AnnotationOutboundPort        = "config.linkerd.io/outbound-port"
	AnnotationCloseWaitTimeout    = "config.linkerd.io/close-wait-timeout"
	// AnnotationRerouteVirtualInterfaces names a virtual machine's interfaces (KubeVirt's), as
	// Istio's istio.io/reroute-virtual-interfaces does: a pod with a VM knows them, a node does not.
	AnnotationRerouteVirtualInterfaces = "config.linkerd.io/reroute-virtual-interfaces"
)

// Annotations lists every annotation the plugin honours, in the order messages name them.
var Annotations = []string{
	AnnotationSkipOutboundPorts, AnnotationSkipInboundPorts, AnnotationSkipSubnets,
	AnnotationSkipInboundSubnets, AnnotationSkipOutboundSubnets, AnnotationProxyUID, AnnotationProxyGID, AnnotationInboundPort, AnnotationOutboundPort,
	AnnotationCloseWaitTimeout, AnnotationRerouteVirtualInterfaces,
}

// FallbackAPIServerPorts are skipped by control-plane pods when the default/kubernetes Service
// cannot be read.
var FallbackAPIServerPorts = []string{"443", "6443"}

// PodAPI is what the plugin reads from Kubernetes: the API server (kubeapi.go), what the node agent
// sent (agentclient.go), or the agent's own watch cache (its audits).
type PodAPI interface {
	Pod(ctx context.Context, namespace, name string) (*Pod, error)
	Namespace(ctx context.Context, name string) (*Namespace, error)
	Service(ctx context.Context, namespace, name string) (*Service, error)
}

// Cached is implemented by a PodAPI that answers from memory (the node agent's watch cache, or
// what the agent sent): its lookups are not counted as API requests.
type Cached interface{ Cached() bool }

// The plugin's view of the API objects it reads: only the fields it uses, with the JSON names of
// core/v1. Importing k8s.io/api/core/v1 (or even apimachinery's small packages) would make every
// plugin start slower (docs/performance.md).

// ObjectMeta is the part of an object's metadata the plugin reads.
type ObjectMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// Pod is a core/v1 Pod, as far as the plugin reads it.
type Pod struct {
	ObjectMeta `json:"metadata"`
	Spec       PodSpec `json:"spec"`
}

// PodSpec holds the containers that decide whether a pod is meshed.
type PodSpec struct {
	InitContainers []Container `json:"initContainers"`
	Containers     []Container `json:"containers"`
}

// RestartPolicyAlways on an init container makes it a native sidecar.
const RestartPolicyAlways = "Always"

// Container is a container's name and, for init containers, its restartPolicy.
type Container struct {
	Name          string `json:"name"`
	RestartPolicy string `json:"restartPolicy"`
}

// Namespace is a core/v1 Namespace: only its metadata is read.
type Namespace struct {
	ObjectMeta `json:"metadata"`
}

// Service is a core/v1 Service: only its ports are read.
type Service struct {
	Spec ServiceSpec `json:"spec"`
}

// ServiceSpec holds a Service's ports.
type ServiceSpec struct {
	Ports []ServicePort `json:"ports"`
}

// ServicePort is one port of a Service and the port it targets on the pods.
type ServicePort struct {
	Port       int32      `json:"port"`
	TargetPort TargetPort `json:"targetPort"`
}

// TargetPort is a Service port's targetPort: core/v1's IntOrString, decoded as apimachinery's
// intstr decodes it (a JSON string is a name, anything else a number).
type TargetPort struct {
	Number int32
	Name   string
}

// MarshalJSON writes a name as a string and a number as a number, as the API server does.
func (t TargetPort) MarshalJSON() ([]byte, error) {
	if t.Name != "" {
		return json.Marshal(t.Name)
	}
	return json.Marshal(t.Number)
}

// UnmarshalJSON reads a number or a name.
func (t *TargetPort) UnmarshalJSON(b []byte) error {
	*t = TargetPort{}
	if len(b) > 0 && b[0] == '"' {
		return json.Unmarshal(b, &t.Name)
	}
	return json.Unmarshal(b, &t.Number)
}

// Kind is what the plugin makes of a pod.
type Kind string

const (
	// KindMeshed has a linkerd-proxy container (a classic sidecar): rules are written.
	KindMeshed Kind = "meshed"
	// KindNativeSidecar has linkerd-proxy as an init container with restartPolicy Always.
	KindNativeSidecar Kind = "native-sidecar"
	// KindLinkerdInit has a linkerd-init init container, which writes its own rules: left alone.
	KindLinkerdInit Kind = "linkerd-init"
	// KindUnmeshed has no proxy: left alone.
	KindUnmeshed Kind = "unmeshed"
)

// NeedsRules reports whether the plugin writes rules for pods of this kind.
func (k Kind) NeedsRules() bool { return k == KindMeshed || k == KindNativeSidecar }

// Classify decides what a pod is, as Linkerd does: a linkerd-init init container wins (it writes
// its own rules); otherwise a container or an init container named linkerd-proxy makes the pod
// meshed, and an init container with restartPolicy Always is a native sidecar.
func Classify(spec *PodSpec) Kind {
	kind := KindUnmeshed
	for _, c := range spec.InitContainers {
		switch c.Name {
		case InitContainerName:
			return KindLinkerdInit
		case ProxyContainerName:
			if c.RestartPolicy == RestartPolicyAlways {
				kind = KindNativeSidecar
			} else if kind == KindUnmeshed {
				kind = KindMeshed
			}
		}
	}
	for _, c := range spec.Containers {
		if c.Name == ProxyContainerName && kind == KindUnmeshed {
			kind = KindMeshed
		}
	}
	return kind
}

// IsControlPlane reports whether the pod is one of Linkerd's control-plane components.
func IsControlPlane(labels map[string]string) bool {
	return labels[LabelControlPlaneComponent] != ""
}

// NeedsNamespace reports whether some honoured annotation is missing from the pod, so that its
// namespace might supply it. An empty value counts as missing, as in Linkerd.
func NeedsNamespace(podAnnotations map[string]string) bool {
	return slices.ContainsFunc(Annotations, func(a string) bool { return podAnnotations[a] == "" })
}

// Object is a pod or a namespace whose annotations are merged, named for messages.
type Object struct {
	Kind        string // "pod" or "namespace"
	Name        string // "ns/name" for a pod, the name for a namespace
	Annotations map[string]string
}

func (o Object) String() string { return o.Kind + " " + o.Name }

// Settings is what a meshed pod gets: the rule builder's config after the annotations.
type Settings struct {
	Config iptables.Config
	// Rules are built from Config.
	Rules *iptables.Ruleset
	// Sources names where each overridden setting came from, by the rule builder's field name,
	// e.g. "outbound-ports-to-ignore": "annotation config.linkerd.io/skip-outbound-ports on
	// namespace web".
	Sources map[string]string
}

// Ceilings bound what a pod's (or its namespace's) annotations may ask of the node, which the
// plugin and agent serve as root: else one pod could hold node-wide conntrack slots for weeks, or
// make every audit of it cost seconds and megabytes. proxy-init's flags (the admins') have none.
type Ceilings struct {
	// MaxCloseWaitSecs is max-close-wait-timeout-secs: the largest close-wait-timeout accepted.
	MaxCloseWaitSecs int64
	// MaxListEntries is max-annotation-list-entries: the most entries one list annotation
	// (ports, subnets) may hold.
	MaxListEntries int
}

// DefaultCeilings are the ceilings of a network config that sets none.
var DefaultCeilings = Ceilings{MaxCloseWaitSecs: 3600, MaxListEntries: 1024}

// Merge applies the annotations of pod, else of its namespace ns (nil when not needed), to base,
// with Linkerd's semantics: skip-inbound-ports and skip-inbound-subnets are appended to the
// configured inbound ports and to skip-subnets' (inbound source) subnets; the other lists
// (skip-outbound-ports, skip-subnets, skip-outbound-subnets, reroute-virtual-interfaces) replace
// theirs; proxy-uid, proxy-gid, inbound-port and outbound-port override; close-wait-timeout (a
// duration such as "1h", or whole seconds) sets the conntrack timeout. apiServerPorts, given for
// control-plane pods, are appended to the outbound ports to ignore. The rule builder validates
// the result; every malformed value is reported at once in a *badinput.Error naming the
// annotation, the object it is on and its whole value. A value beyond one of lim's ceilings is
// refused too; a list over its ceiling is reported by its length, not echoed.
func Merge(base iptables.Config, lim Ceilings, pod Object, ns *Object, apiServerPorts []string) (Settings, error) {
	m := &merger{s: Settings{Config: base, Sources: map[string]string{}}, lim: lim, pod: pod, ns: ns,
		found: map[string][]badinput.Problem{}}
	// base's lists are only ever appended to clipped (copied), never written in place.
	m.annotations()
	m.s.Config.OutboundPortsToIgnore = append(slices.Clip(m.s.Config.OutboundPortsToIgnore), apiServerPorts...)
	// Values of the wrong form left their field as it was in base, which is valid, so every
	// other problem is still found here, at once.
	rs, err := iptables.Build(m.s.Config)
	if verr, ok := badinput.As(err); ok {
		for _, p := range verr.Problems {
			src, ok := m.source(p)
			if !ok {
				// Not from an annotation: base itself was invalid (ParseConfig refuses that).
				return Settings{}, err
			}
			m.probs = append(m.probs, src)
		}
	}
	if len(m.probs) > 0 {
		order := func(p badinput.Problem) int {
			return slices.Index(Annotations, strings.TrimPrefix(p.Field, "annotation "))
		}
		slices.SortStableFunc(m.probs, func(a, b badinput.Problem) int { return order(a) - order(b) })
		return Settings{}, &badinput.Error{What: "invalid annotation", Problems: m.probs}
	}
	m.s.Rules = rs
	return m.s, nil
}

// merger is one Merge: the settings being built, the problems found so far, and, by config
// field, the annotations that set it, so that a value the rule builder refuses is reported
// against the annotation that holds it.
type merger struct {
	s     Settings
	lim   Ceilings
	pod   Object
	ns    *Object
	probs []badinput.Problem
	found map[string][]badinput.Problem
}

// annotations applies each annotation in Linkerd's order (Merge's comment): skip-subnets before
// skip-inbound-subnets, which appends to it.
func (m *merger) annotations() {
	c := &m.s.Config
	for _, l := range []struct {
		key, field string // the annotation, and the rule builder's field it sets
		dst        *[]string
		appends    bool
	}{
		{AnnotationSkipOutboundPorts, iptables.FieldOutboundPortsToIgnore, &c.OutboundPortsToIgnore, false},
		{AnnotationSkipInboundPorts, iptables.FieldInboundPortsToIgnore, &c.InboundPortsToIgnore, true},
		{AnnotationSkipSubnets, iptables.FieldInboundSubnetsToIgnore, &c.InboundSubnetsToIgnore, false},
		{AnnotationSkipInboundSubnets, iptables.FieldInboundSubnetsToIgnore, &c.InboundSubnetsToIgnore, true},
		{AnnotationSkipOutboundSubnets, iptables.FieldOutboundSubnetsToIgnore, &c.OutboundSubnetsToIgnore, false},
		{AnnotationRerouteVirtualInterfaces, iptables.FieldRerouteVirtualInterfaces, &c.RerouteVirtualInterfaces, false},
	} {
		m.each(l.key, l.field, true, func(v string) string {
			if !l.appends {
				*l.dst = nil
			}
			*l.dst = append(slices.Clip(*l.dst), splitList(v)...)
			return ""
		})
	}
	m.each(AnnotationProxyUID, iptables.FieldProxyUID, false, integer(&c.ProxyUID, "UID"))
	m.each(AnnotationProxyGID, iptables.FieldProxyGID, false, integer(&c.ProxyGID, "GID"))
	m.each(AnnotationInboundPort, iptables.FieldInboundProxyPort, false, integer(&c.InboundProxyPort, "port"))
	m.each(AnnotationOutboundPort, iptables.FieldOutboundProxyPort, false, integer(&c.OutboundProxyPort, "port"))
	// close-wait-timeout: what the proxy injector accepts (a Go duration such as "1h"), and whole
	// seconds for convenience. Whether the kernel takes that many is the rule builder's check.
	m.each(AnnotationCloseWaitTimeout, iptables.FieldCloseWait, false, func(v string) string {
		secs, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			d, err := time.ParseDuration(v)
			if err != nil {
				return "not a duration such as \"1h\" or \"3600s\""
			}
			secs = int64(d / time.Second)
		}
		switch {
		case secs < 1:
			return "must be at least 1s"
		case secs > m.lim.MaxCloseWaitSecs:
			return fmt.Sprintf("%ds is more than max-close-wait-timeout-secs allows (%d)", secs, m.lim.MaxCloseWaitSecs)
		}
		c.CloseWaitSecs = secs
		return ""
	})
}

// each takes one annotation when present, from the pod, else from its namespace; set converts
// its value into the config's field, and returns why it cannot when the value does not even have
// the right form, so that the builder's own validation of that field is reported as a problem
// with the annotation. A list is bounded by max-annotation-list-entries.
func (m *merger) each(key, field string, list bool, set func(v string) string) {
	from, v := &m.pod, m.pod.Annotations[key]
	if v == "" && m.ns != nil {
		from, v = m.ns, m.ns.Annotations[key]
	}
	if v == "" {
		return
	}
	src := badinput.Problem{Field: "annotation " + key, Value: v, On: from.String()}
	if n := len(splitList(v)); list && n > m.lim.MaxListEntries {
		src.Value = fmt.Sprintf("(%d entries)", n)
		src.Reason = fmt.Sprintf("more entries than max-annotation-list-entries allows (%d)", m.lim.MaxListEntries)
		m.probs = append(m.probs, src)
		return
	}
	if reason := set(strings.TrimSpace(v)); reason != "" {
		src.Reason = reason
		m.probs = append(m.probs, src)
		return
	}
	m.found[field] = append(m.found[field], src)
	m.s.Sources[field] = strings.TrimPrefix(m.s.Sources[field]+", "+src.Field+" on "+src.On, ", ")
}

// source is the rule builder's problem p as a problem of the annotation that holds the bad
// value, of those that fed p's field; false when no annotation fed it.
func (m *merger) source(p badinput.Problem) (badinput.Problem, bool) {
	srcs, ok := m.found[p.Field]
	if !ok {
		return p, false
	}
	src := srcs[len(srcs)-1]
	for _, c := range srcs {
		if slices.Contains(splitList(c.Value), p.Value) {
			src = c
			break
		}
	}
	src.Reason = p.Reason
	if p.Value != strings.TrimSpace(src.Value) && !strings.Contains(p.Reason, p.Value) {
		src.Reason = fmt.Sprintf("%q: %s", p.Value, p.Reason)
	}
	return src, true
}

// integer sets *dst from a whole number, what naming the value in the reason it gives when the
// value is not one.
func integer(dst *int, what string) func(string) string {
	return func(v string) string {
		n, err := strconv.Atoi(v)
		if err != nil {
			return "not an integer " + what
		}
		*dst = n
		return ""
	}
}

// splitList splits a comma-separated annotation value into trimmed, non-empty items.
func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// APIServerPorts returns the ports and numeric targetPorts of the default/kubernetes Service,
// deduplicated, in order. Named targetPorts cannot be resolved without the endpoints and are
// skipped. It returns nil when the Service has no usable port.
func APIServerPorts(svc *Service) []string {
	var out []string
	add := func(p int32) {
		if s := strconv.Itoa(int(p)); p > 0 && p <= 65535 && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	for _, p := range svc.Spec.Ports {
		add(p.Port)
		add(p.TargetPort.Number)
	}
	return out
}
