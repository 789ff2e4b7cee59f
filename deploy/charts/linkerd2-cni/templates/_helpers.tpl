{{/* Labels every object carries: the one `linkerd check` looks for, and the user's. */}}
{{- define "linkerd-cni.labels" -}}
linkerd.io/cni-resource: "true"
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The node's directories: the value, or the distribution preset's when left at the default
(docs/install.md, "Paths per distribution", says where each comes from; docs/helm-chart.md's
table of presets is checked against these renderings). k3s-custom-cni and rke2 keep the defaults:
their containerd has no CNI section of its own, but their CRI socket is k3s's. */}}
{{- define "linkerd-cni.netDir" -}}
{{- $presets := dict "k3s" "/var/lib/rancher/k3s/agent/etc/cni/net.d" "k3s-custom-cni" "/etc/cni/net.d" "rke2" "/etc/cni/net.d" "gke" "/etc/cni/net.d" "microk8s" "/var/snap/microk8s/current/args/cni-network" "openshift" "/etc/cni/multus/net.d" -}}
{{- if and .Values.distribution (eq .Values.destCNINetDir "/etc/cni/net.d") -}}
{{- get $presets .Values.distribution -}}
{{- else -}}
{{- .Values.destCNINetDir -}}
{{- end -}}
{{- end -}}

{{- define "linkerd-cni.binDir" -}}
{{- $presets := dict "k3s" "/var/lib/rancher/k3s/data/cni" "k3s-custom-cni" "/opt/cni/bin" "rke2" "/opt/cni/bin" "gke" "/home/kubernetes/bin" "microk8s" "/var/snap/microk8s/current/opt/cni/bin" "openshift" "/var/lib/cni/bin" -}}
{{- if and .Values.distribution (eq .Values.destCNIBinDir "/opt/cni/bin") -}}
{{- get $presets .Values.distribution -}}
{{- else -}}
{{- .Values.destCNIBinDir -}}
{{- end -}}
{{- end -}}

{{/* The file the plugin's config is written into alone, for NetworkAttachmentDefinitions: the
value, or linkerd-cni.conf with the openshift preset (Multus's /etc/cni/multus/net.d). */}}
{{- define "linkerd-cni.standaloneConf" -}}
{{- if .Values.standaloneConf -}}
{{- .Values.standaloneConf -}}
{{- else if eq .Values.distribution "openshift" -}}
linkerd-cni.conf
{{- end -}}
{{- end -}}

{{/* The runtime's CRI socket: the value, or the distribution preset's when left at the default.
k3s runs its own containerd, with or without its flannel, and RKE2 the same one. */}}
{{- define "linkerd-cni.criSocket" -}}
{{- $presets := dict "k3s" "/run/k3s/containerd/containerd.sock" "k3s-custom-cni" "/run/k3s/containerd/containerd.sock" "rke2" "/run/k3s/containerd/containerd.sock" "microk8s" "/var/snap/microk8s/common/run/containerd.sock" "openshift" "/var/run/crio/crio.sock" -}}
{{- if and (hasKey $presets .Values.distribution) (eq .Values.agent.criSocket "/run/containerd/containerd.sock") -}}
{{- get $presets .Values.distribution -}}
{{- else -}}
{{- .Values.agent.criSocket -}}
{{- end -}}
{{- end -}}

{{/* An image reference from a dict of name, version (none when name holds its tag already) and
digest: name:version, or, given a digest, name@digest with any tag left out, so that what runs is
exactly the digest and no tag can be read as if it mattered. */}}
{{- define "linkerd-cni.image" -}}
{{- if .digest -}}
{{- regexReplaceAll ":[^:/]+$" .name "" }}@{{ .digest }}
{{- else if .version -}}
{{- .name }}:{{ .version }}
{{- else -}}
{{- .name }}
{{- end -}}
{{- end -}}

{{/* Whether the agent audits: an auditPeriod other than zero ("0s", "0m", "0"). */}}
{{- define "linkerd-cni.auditing" -}}
{{- not (regexMatch "^[0.]+[a-zµ]*$" (toString .Values.agent.auditPeriod)) -}}
{{- end -}}

{{- define "linkerd-cni.privileged" -}}
{{- .Values.privileged -}}
{{- end -}}

{{/* The SELinux type of install-cni and the agent: seLinuxType, or spc_t with the openshift
preset (SELinux enforcing; container_t may not write the node's CNI directories nor reach CRI-O's
socket or other pods' namespaces), unless privileged is set, which needs none. */}}
{{- define "linkerd-cni.seLinuxType" -}}
{{- if not .Values.privileged -}}
{{- if .Values.seLinuxType -}}{{ .Values.seLinuxType }}{{- else if eq .Values.distribution "openshift" -}}spc_t{{- end -}}
{{- end -}}
{{- end -}}

{{/* A comma-separated list (a string or a number) as JSON strings: "a","b". */}}
{{- define "linkerd-cni.quotedList" -}}
{{- $out := list -}}
{{- range (toString . | splitList ",") -}}
{{- if trim . -}}{{- $out = append $out (trim . | quote) -}}{{- end -}}
{{- end -}}
{{- join "," $out -}}
{{- end -}}

{{/* Linkerd's resources form (cpu/memory/ephemeral-storage, each limit and request) as a
container's resources. */}}
{{- define "linkerd-cni.resources" -}}
{{- $limits := dict -}}
{{- $requests := dict -}}
{{- range $name, $r := . -}}
{{- with ($r).limit }}{{ $_ := set $limits $name (toString .) }}{{ end -}}
{{- with ($r).request }}{{ $_ := set $requests $name (toString .) }}{{ end -}}
{{- end -}}
{{- if or $limits $requests -}}
resources:
  {{- with $limits }}
  limits:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $requests }}
  requests:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}
{{- end -}}

{{/* host and port of a host:port admin address. */}}
{{- define "linkerd-cni.host" -}}
{{- regexReplaceAll ":[0-9]+$" . "" | trimPrefix "[" | trimSuffix "]" -}}
{{- end -}}
{{- define "linkerd-cni.port" -}}
{{- regexFind "[0-9]+$" . -}}
{{- end -}}

{{/* Values the schema cannot judge. */}}
{{- define "linkerd-cni.check" -}}
{{- if .Values.enablePSP -}}
{{- fail "enablePSP true: PodSecurityPolicy was removed in Kubernetes 1.25; set enablePSP: false (the namespace's pod-security.kubernetes.io/enforce label replaces it)" -}}
{{- end -}}
{{- if hasSuffix "linkerd/cni-plugin" .Values.image.name -}}
{{- fail (printf "image.name %q is Linkerd's image, which does not hold this chart's programs: use ghcr.io/kubemesh/linkerd-cni (or your mirror of it), e.g. --set image.name=ghcr.io/kubemesh/linkerd-cni,image.version=%s" .Values.image.name .Chart.AppVersion) -}}
{{- end -}}
{{- if and .Values.socketLBCheck.enabled (or (eq .Values.socketLBCheck.namespace .Release.Namespace) (has .Values.socketLBCheck.namespace .Values.excludeNamespaces)) -}}
{{- fail (printf "socketLBCheck.namespace %q: the plugin leaves that namespace's pods alone (its own, or excludeNamespaces), so the check would prove nothing; pick another" .Values.socketLBCheck.namespace) -}}
{{- end -}}
{{- if and (not .Values.agent.enabled) (eq .Values.installer.adminAddr .Values.repairController.adminAddr) -}}
{{- fail (printf "installer.adminAddr and repairController.adminAddr are both %q: the two containers share the node's network namespace and need two ports" .Values.installer.adminAddr) -}}
{{- end -}}
{{- if and .Values.agent.enabled (eq .Values.installer.adminAddr .Values.agent.adminAddr) -}}
{{- fail (printf "installer.adminAddr and agent.adminAddr are both %q: the two containers share the node's network namespace and need two ports" .Values.installer.adminAddr) -}}
{{- end -}}
{{- if and .Values.agent.enabled .Values.agent.podMonitor.enabled (regexMatch "^(127\\.|\\[::1\\])" .Values.agent.adminAddr) -}}
{{- fail (printf "agent.podMonitor.enabled: Prometheus cannot scrape agent.adminAddr %q, which is the node's loopback; set agent.adminAddr to an address it reaches, e.g. 0.0.0.0:9993" .Values.agent.adminAddr) -}}
{{- end -}}
{{- end -}}

{{/* Whether something in the DaemonSet deletes pods: the agent in delete mode, or the repair
controller (which runs only without the agent). */}}
{{- define "linkerd-cni.deletesPods" -}}
{{- or (and .Values.agent.enabled (eq .Values.agent.mode "delete")) (and (not .Values.agent.enabled) .Values.repairController.enabled) -}}
{{- end -}}

{{/* Whether the agent watches the namespaces and default/kubernetes: it does for its lookups and
its audits. */}}
{{- define "linkerd-cni.watchesNamespaces" -}}
{{- and .Values.agent.enabled (or .Values.agent.lookups (eq (include "linkerd-cni.auditing" .) "true")) -}}
{{- end -}}
