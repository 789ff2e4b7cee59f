package agent

import (
	"context"
	"io"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubemesh/proxy-init/cniplugin/wire"
)

// MetricsPrefix starts the agent's metric names; RepairMetricsPrefix those of `linkerd-cni
// repair`, as in Linkerd's repair controller.
const (
	MetricsPrefix       = "linkerd_cni_agent_"
	RepairMetricsPrefix = "linkerd_cni_repair_controller_"
)

// metrics live in the agent's own registry, so two agents (tests) never collide and nothing
// leaks into the global default registry.
type metrics struct {
	registry *prometheus.Registry
	// Deletions (delete mode), as Linkerd's repair controller counts them.
	deleted, deleteErrors, eventErrors prometheus.Counter
	// Audits.
	audited, drifted, healed, healErrors, auditErrors prometheus.Counter
	lockBusy, edited                                  prometheus.Counter
	auditSeconds                                      prometheus.Histogram
	chained, installerReady                           prometheus.Gauge
	// The socket and the plugin's reports.
	requests, calls, lookups, writes *prometheus.CounterVec
	callSeconds                      *prometheus.HistogramVec
}

// newMetrics registers the metrics with prefix; installer_ready only with installer (an agent that
// polls the installer's /ready).
func newMetrics(prefix string, queueLen func() float64, installer bool) *metrics {
	reg := prometheus.NewRegistry()
	auto := promauto.With(reg)
	counter := func(name, help string) prometheus.Counter {
		return auto.NewCounter(prometheus.CounterOpts{Name: prefix + name, Help: help})
	}
	var installerReg prometheus.Registerer // nil: not registered
	if installer {
		installerReg = reg
	}
	m := &metrics{
		registry:     reg,
		deleted:      counter("deleted_total", "Pods deleted (delete mode): their linkerd-network-validator exited 95, or an audit found their rules differ."),
		deleteErrors: counter("delete_errors_total", "Failed attempts to delete such a pod (each is retried)."),
		eventErrors:  counter("event_errors_total", "Events that could not be recorded."),
		audited:      counter("pods_audited_total", "Audits of a meshed pod's rules (CHECK's logic against the settings its sandbox was set up with)."),
		drifted:      counter("pods_drifted_total", "Audits that found a meshed pod's rules missing or different."),
		healed:       counter("pods_healed_total", "Drifted pods whose rules were rewritten in place (repair mode)."),
		healErrors:   counter("heal_errors_total", "Drifted pods whose rules could not be rewritten."),
		auditErrors:  counter("audit_errors_total", "Audits that could not run: no network namespace, an unreadable pod, an invalid annotation."),
		lockBusy:     counter("audit_lock_busy_total", "Audits skipped because the pod's namespace lock was held longer than the audit waits (1s); retried next period."),
		edited:       counter("annotation_edits_total", "Annotation (or control-plane label) edits found on running pods, each distinct edit once: reported, not applied (annotations are read at sandbox set-up)."),
		auditSeconds: auto.NewHistogram(prometheus.HistogramOpts{Name: prefix + "audit_duration_seconds",
			Help: "Time to audit (and heal) one pod.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		chained: auto.NewGauge(prometheus.GaugeOpts{Name: prefix + "cni_config_chained",
			Help: "1 when the node's CNI config the runtime reads chains linkerd-cni (the installer's state), else 0."}),
		installerReady: promauto.With(installerReg).NewGauge(prometheus.GaugeOpts{Name: prefix + "installer_ready",
			Help: "1 while the installer's /ready answers 200 (linkerd-cni is in every CNI config of the node), else 0."}),
		requests: auto.NewCounterVec(prometheus.CounterOpts{Name: prefix + "socket_requests_total",
			Help: "Messages on the plugin socket by outcome: write (an ADD the agent ran: route 1), lookup (the pod sent, from the watch), kubelet (the pod sent, from the kubelet's pods API), del (a DEL heard), not-synced, not-seen (the plugin reads the API); refused (a peer without CAP_SYS_ADMIN in the initial user namespace, or descriptors attached), malformed, too-large, version (logged at warning)."},
			[]string{"outcome"}),
		calls: auto.NewCounterVec(prometheus.CounterOpts{Name: prefix + "plugin_calls_total",
			Help: "CNI plugin calls the plugin reported, by command and result."}, []string{"command", "result"}),
		callSeconds: auto.NewHistogramVec(prometheus.HistogramOpts{Name: prefix + "plugin_call_duration_seconds",
			Help: "Duration of the CNI plugin calls the plugin reported, from its main.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)},
			[]string{"command"}),
		lookups: auto.NewCounterVec(prometheus.CounterOpts{Name: prefix + "plugin_lookups_total",
			Help: "Where the plugin's ADD and CHECK calls read the pod: agent (its watch cache), kubelet (the agent's read of the kubelet's pods API) or api."}, []string{"source"}),
		writes: auto.NewCounterVec(prometheus.CounterOpts{Name: prefix + "plugin_rules_written_total",
			Help: "ADDs that wrote a meshed pod's rules, by who wrote them: agent (route 1) or plugin (route 2, the agent's lookup or the plugin's own API reads); reported by plugins that ask for writes."}, []string{"route"}),
	}
	auto.NewGaugeFunc(prometheus.GaugeOpts{Name: prefix + "queue_size",
		Help: "Pods waiting for the workers (audit or deletion), including retries."}, queueLen)
	reg.MustRegister(collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// plugin counts one call the plugin reported.
func (m *metrics) plugin(r wire.Report) {
	cmd := r.Command
	if cmd != "ADD" && cmd != "CHECK" && cmd != "DEL" {
		return
	}
	result := "ok"
	if r.Result != "ok" {
		result = "error"
	}
	m.calls.WithLabelValues(cmd, result).Inc()
	if r.Seconds > 0 {
		h := m.callSeconds.WithLabelValues(cmd)
		// The runtime's trace is an exemplar of the duration, not a label: one series per trace
		// would grow without bound.
		if e, ok := h.(prometheus.ExemplarObserver); ok && wire.ValidTraceID(r.TraceID) {
			e.ObserveWithExemplar(r.Seconds, prometheus.Labels{"trace_id": r.TraceID})
		} else {
			h.Observe(r.Seconds)
		}
	}
	if r.Lookup == "agent" || r.Lookup == "api" || r.Lookup == wire.SourceKubelet {
		m.lookups.WithLabelValues(r.Lookup).Inc()
	}
	if cmd == "ADD" && r.Result == "ok" && (r.Route == wire.RouteAgent || r.Route == wire.RoutePlugin) {
		m.writes.WithLabelValues(r.Route).Inc()
	}
}

// installerPoll is how often the agent asks the installer's /ready, as its readiness probe does.
const installerPoll = 5 * time.Second

// watchInstaller sets installer_ready from the installer's /ready at url until ctx ends: the
// installer serves it on the node's loopback only, which the agent (in the node's network
// namespace, like the installer) reaches and Prometheus does not.
func (a *Agent) watchInstaller(ctx context.Context, url string) {
	client := &http.Client{Timeout: 2 * time.Second}
	tick(ctx, installerPoll, false, func() bool {
		ready := false
		if req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil); err == nil {
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
				resp.Body.Close()
				ready = resp.StatusCode == http.StatusOK
			}
		}
		a.metrics.installerReady.Set(boolGauge(ready))
		return true
	})
}

// Handler serves the admin endpoints: /live (200 while Run runs, unless the runtime's CRI has
// refused every call for two minutes), /ready (200 once the watches have synced) and /metrics
// (Prometheus text format).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /live", func(w http.ResponseWriter, _ *http.Request) {
		if !a.running.Load() {
			http.Error(w, "agent not running", http.StatusServiceUnavailable) // before Run, or after it
			return
		}
		if h, ok := a.opts.Sandboxes.(interface{ Healthy() error }); ok {
			err := h.Healthy()
			// The kubelet probes every few seconds: the change is logged, not each answer.
			if a.notLive.Swap(err != nil) != (err != nil) {
				if err != nil {
					a.log.Error("not live: restart me to reach the runtime again", "error", err.Error())
				} else {
					a.log.Info("live again: the runtime answers")
				}
			}
			if err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		_, _ = w.Write([]byte("live\n"))
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		if !a.Ready() {
			http.Error(w, "watches not synced yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	// OpenMetrics, for a scraper that asks for it, carries the calls' trace exemplars.
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.registry, promhttp.HandlerOpts{EnableOpenMetrics: true}))
	return mux
}
