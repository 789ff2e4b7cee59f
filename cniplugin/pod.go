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

// Annotations lists every annotation the plugin honours, in the order they are applied.
var Annotations = []string{
	AnnotationSkipOutboundPorts, AnnotationSkipInboundPorts, AnnotationSkipSubnets,
	AnnotationSkipInboundSubnets, AnnotationSkipOutboundSubnets, AnnotationProxyUID, AnnotationProxyGID, AnnotationInboundPort, AnnotationOutboundPort,
	AnnotationCloseWaitTimeout, AnnotationRerouteVirtualInterfaces,
}

// FallbackAPIServerPorts are skipped by control-plane pods when the default/kubernetes Service
// cannot be read.
var FallbackAPIServerPorts = []string{"443", "6443"}

// PodAPI is what the plugin reads from Kubernetes: the API server over the kubeconfig
// (kubeapi.go), what the node agent sent (agentclient.go), or the agent's own watch cache (its audits);
// tests may substitute their own.
type PodAPI interface {
	Pod(ctx context.Context, namespace, name string) (*Pod, error)
	Namespace(ctx context.Context, name string) (*Namespace, error)
	Service(ctx context.Context, namespace, name string) (*Service, error)
}

// Cached is implemented by a PodAPI that answers from memory (the node agent's watch cache, or
// what the agent sent): its lookups are not API requests, and the plugin does not count them as such.
type Cached interface{ Cached() bool }

func cached(api PodAPI) bool {
	c, ok := api.(Cached)
	return ok && c.Cached()
}

// The plugin's view of the API objects it reads: only the fields it uses, with the JSON names of
// core/v1, decoded from the API server's JSON. Importing k8s.io/api/core/v1 instead links its
// scheme and protobuf code, which make the binary larger and every plugin start slower (the
// figures are in docs/performance.md); even apimachinery's small packages link klog and a CBOR
// codec, whose initialisation the node's plugin would pay on every start.

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

// TargetPort is a Service port's targetPort: core/v1's IntOrString, a port number or the name of a
// container port, decoded as apimachinery's intstr decodes it (a JSON string is a name, anything
// else a number).
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
	// KindNativeSidecar has linkerd-proxy as an init container with restartPolicy Always:
	// rules are written.
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
	for _, a := range Annotations {
		if podAnnotations[a] == "" {
			return true
		}
	}
	return false
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

// listAnnotations are the annotations holding lists, which max-annotation-list-entries bounds.
var listAnnotations = map[string]bool{
	AnnotationSkipOutboundPorts: true, AnnotationSkipInboundPorts: true, AnnotationSkipSubnets: true,
	AnnotationSkipInboundSubnets: true, AnnotationSkipOutboundSubnets: true, AnnotationRerouteVirtualInterfaces: true,
}

// annotationFields maps each annotation to the rule builder's field it sets, so that the
// builder's own validation of that field is reported as a problem with the annotation.
var annotationFields = map[string]string{
	AnnotationSkipOutboundPorts:   iptables.FieldOutboundPortsToIgnore,
	AnnotationSkipInboundPorts:    iptables.FieldInboundPortsToIgnore,
	AnnotationSkipSubnets:         iptables.FieldInboundSubnetsToIgnore,
	AnnotationSkipInboundSubnets:  iptables.FieldInboundSubnetsToIgnore,
	AnnotationSkipOutboundSubnets: iptables.FieldOutboundSubnetsToIgnore,
	AnnotationProxyUID:            iptables.FieldProxyUID,
	AnnotationProxyGID:            iptables.FieldProxyGID,
	AnnotationInboundPort:         iptables.FieldInboundProxyPort,
	AnnotationOutboundPort:        iptables.FieldOutboundProxyPort,
	AnnotationCloseWaitTimeout:    iptables.FieldCloseWait,

	AnnotationRerouteVirtualInterfaces: iptables.FieldRerouteVirtualInterfaces,
}

// Ceilings bound what a pod's (or its namespace's) annotations may ask of the node. A pod author
// controls annotations, while the plugin and the agent run as root: without a bound, one pod could
// hold node-wide conntrack slots for weeks, or make every audit of it cost seconds and megabytes.
// They are keys of the node's network config; proxy-init's flags, which cluster admins set, have none.
type Ceilings struct {
	// MaxCloseWaitSecs is max-close-wait-timeout-secs: the largest close-wait-timeout accepted.
	MaxCloseWaitSecs int64
	// MaxListEntries is max-annotation-list-entries: the most entries one list annotation
	// (ports, subnets) may hold.
	MaxListEntries int
}

// The ceilings when the network config sets none.
const (
	DefaultMaxCloseWaitSecs         = 3600
	DefaultMaxAnnotationListEntries = 1024
)

// DefaultCeilings are the ceilings of a network config that sets none.
var DefaultCeilings = Ceilings{MaxCloseWaitSecs: DefaultMaxCloseWaitSecs, MaxListEntries: DefaultMaxAnnotationListEntries}

// Merge applies the annotations of pod, then of its namespace ns (which may be nil when it was
// not needed), to base, with Linkerd's semantics:
//   - skip-outbound-ports replaces the configured outbound-ports-to-ignore;
//   - skip-inbound-ports is appended to inbound-ports-to-ignore;
//   - skip-subnets replaces subnets-to-ignore (inbound source subnets);
//   - skip-inbound-subnets is appended to them, after skip-subnets, as skip-inbound-ports is to
//     the inbound ports;
//   - skip-outbound-subnets replaces outbound-subnets-to-ignore (destinations), as
//     skip-outbound-ports replaces the outbound ports;
//   - proxy-uid, proxy-gid, inbound-port and outbound-port override;
//   - close-wait-timeout (a duration such as "1h", or whole seconds) sets the conntrack timeout;
//   - reroute-virtual-interfaces replaces the configured reroute-virtual-interfaces.
//
// Each annotation is taken from the pod when it has a non-empty value there, else from the
// namespace. apiServerPorts, given for control-plane pods, are appended to the outbound ports to
// ignore after the annotations. The result is validated by the rule builder, like every other
// input; every malformed value is reported at once in a *badinput.Error whose problems name the
// annotation, the object it is on and its whole value. A value beyond one of lim's ceilings is
// refused too; a list over its ceiling is reported by its length, not echoed.
func Merge(base iptables.Config, lim Ceilings, pod Object, ns *Object, apiServerPorts []string) (Settings, error) {
	m := &merger{
		s:     Settings{Config: base, Sources: map[string]string{}},
		lim:   lim,
		pod:   pod,
		ns:    ns,
		found: map[string][]badinput.Problem{},
	}
	m.s.Config.PortsToRedirect = clone(base.PortsToRedirect)
	m.s.Config.InboundPortsToIgnore = clone(base.InboundPortsToIgnore)
	m.s.Config.OutboundPortsToIgnore = clone(base.OutboundPortsToIgnore)
	m.s.Config.InboundSubnetsToIgnore = clone(base.InboundSubnetsToIgnore)
	m.s.Config.OutboundSubnetsToIgnore = clone(base.OutboundSubnetsToIgnore)
	m.annotations()
	if len(apiServerPorts) > 0 {
		m.s.Config.OutboundPortsToIgnore = append(m.s.Config.OutboundPortsToIgnore, apiServerPorts...)
	}
	// Values of the wrong form left their field as it was in base, which is valid, so every
	// other problem is still found here, at once. (The API server's ports are always valid.)
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

// annotations applies each annotation in Linkerd's order (Merge's comment).
func (m *merger) annotations() {
	c := &m.s.Config
	m.each(AnnotationSkipOutboundPorts, func(v string) string {
		c.OutboundPortsToIgnore = splitList(v)
		return ""
	})
	m.each(AnnotationSkipInboundPorts, func(v string) string {
		c.InboundPortsToIgnore = append(c.InboundPortsToIgnore, splitList(v)...)
		return ""
	})
	m.each(AnnotationSkipSubnets, func(v string) string {
		c.InboundSubnetsToIgnore = splitList(v)
		return ""
	})
	m.each(AnnotationSkipInboundSubnets, func(v string) string {
		c.InboundSubnetsToIgnore = append(c.InboundSubnetsToIgnore, splitList(v)...)
		return ""
	})
	m.each(AnnotationSkipOutboundSubnets, func(v string) string {
		c.OutboundSubnetsToIgnore = splitList(v)
		return ""
	})
	m.each(AnnotationProxyUID, integer(&c.ProxyUID, "UID"))
	m.each(AnnotationProxyGID, integer(&c.ProxyGID, "GID"))
	m.each(AnnotationInboundPort, integer(&c.InboundProxyPort, "port"))
	m.each(AnnotationOutboundPort, integer(&c.OutboundProxyPort, "port"))
	m.each(AnnotationRerouteVirtualInterfaces, func(v string) string {
		c.RerouteVirtualInterfaces = splitList(v)
		return ""
	})
	m.each(AnnotationCloseWaitTimeout, func(v string) string {
		secs, reason := parseCloseWait(v)
		if reason == "" && secs > m.lim.MaxCloseWaitSecs {
			return fmt.Sprintf("%ds is more than max-close-wait-timeout-secs allows (%d)", secs, m.lim.MaxCloseWaitSecs)
		}
		c.CloseWaitSecs = secs
		return reason
	})
}

// each takes one annotation when present, from the pod, else from its namespace; set converts
// its value into the config, and returns why it cannot when the value does not even have the
// right form.
func (m *merger) each(key string, set func(v string) string) {
	var v string
	var from *Object
	if v = m.pod.Annotations[key]; v != "" {
		from = &m.pod
	} else if m.ns != nil && m.ns.Annotations[key] != "" {
		v, from = m.ns.Annotations[key], m.ns
	}
	if from == nil {
		return
	}
	src := badinput.Problem{Field: "annotation " + key, Value: v, On: from.String()}
	if n := len(splitList(v)); listAnnotations[key] && n > m.lim.MaxListEntries {
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
	field := annotationFields[key]
	m.found[field] = append(m.found[field], src)
	from1 := "annotation " + key + " on " + from.String()
	if prev := m.s.Sources[field]; prev != "" {
		from1 = prev + ", " + from1
	}
	m.s.Sources[field] = from1
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

// parseCloseWait accepts what the proxy injector accepts (a Go duration such as "1h"), and whole
// seconds for convenience, and returns whole seconds. Whether the kernel takes that many is the
// rule builder's check.
func parseCloseWait(v string) (int64, string) {
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 1 {
			return 0, "must be at least 1s"
		}
		return n, ""
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, "not a duration such as \"1h\" or \"3600s\""
	}
	if d < time.Second {
		return 0, "must be at least 1s"
	}
	return int64(d / time.Second), ""
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
	seen := map[int32]bool{}
	add := func(p int32) {
		if p > 0 && p <= 65535 && !seen[p] {
			seen[p] = true
			out = append(out, strconv.Itoa(int(p)))
		}
	}
	for _, p := range svc.Spec.Ports {
		add(p.Port)
		add(p.TargetPort.Number)
	}
	return out
}
