package agent

import (
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kubemesh/proxy-init/cniplugin"
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
	auditSeconds                                      prometheus.Histogram
	chained                                           prometheus.Gauge
	// The socket and the plugin's reports.
	requests    *prometheus.CounterVec
	calls       *prometheus.CounterVec
	callSeconds *prometheus.HistogramVec
	lookups     *prometheus.CounterVec
}

func newMetrics(prefix string, queueLen func() float64) *metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: prefix + name, Help: help})
	}
	m := &metrics{
		registry:     prometheus.NewRegistry(),
		deleted:      counter("deleted_total", "Pods deleted (delete mode): their linkerd-network-validator exited 95, or an audit found their rules differ."),
		deleteErrors: counter("delete_errors_total", "Failed attempts to delete such a pod (each is retried)."),
		eventErrors:  counter("event_errors_total", "Events that could not be recorded."),
		audited:      counter("pods_audited_total", "Audits of a meshed pod's rules (CHECK's logic against its current annotations)."),
		drifted:      counter("pods_drifted_total", "Audits that found a meshed pod's rules missing or different."),
		healed:       counter("pods_healed_total", "Drifted pods whose rules were rewritten in place (repair mode)."),
		healErrors:   counter("heal_errors_total", "Drifted pods whose rules could not be rewritten."),
		auditErrors:  counter("audit_errors_total", "Audits that could not run: no network namespace, an unreadable pod, an invalid annotation."),
		auditSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: prefix + "audit_duration_seconds",
			Help: "Time to audit (and heal) one pod.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}),
		chained: prometheus.NewGauge(prometheus.GaugeOpts{Name: prefix + "cni_config_chained",
			Help: "1 when the node's CNI config the runtime reads chains linkerd-cni (the installer's state), else 0."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefix + "socket_requests_total",
			Help: "Plugin requests on the socket by outcome: handled (the agent ran the call), lookup (the agent looked the pod up, the plugin wrote), fallback (the plugin did it all), malformed, refused."},
			[]string{"outcome"}),
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefix + "plugin_calls_total",
			Help: "CNI plugin calls the plugin reported, by command and result."}, []string{"command", "result"}),
		callSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: prefix + "plugin_call_duration_seconds",
			Help: "Duration of the CNI plugin calls the plugin reported, from its main.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)},
			[]string{"command"}),
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: prefix + "plugin_lookups_total",
			Help: "Where the plugin's ADD and CHECK calls read the pod: agent (its watch cache) or api."}, []string{"source"}),
	}
	m.registry.MustRegister(m.deleted, m.deleteErrors, m.eventErrors, m.audited, m.drifted, m.healed, m.healErrors,
		m.auditErrors, m.auditSeconds, m.chained, m.requests, m.calls, m.callSeconds, m.lookups,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: prefix + "queue_size",
			Help: "Pods waiting for the worker (audit or deletion), including retries."}, queueLen),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// plugin counts one call the plugin reported.
func (m *metrics) plugin(r cniplugin.AgentReport) {
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
		m.callSeconds.WithLabelValues(cmd).Observe(r.Seconds)
	}
	if r.Lookup == "agent" || r.Lookup == "api" {
		m.lookups.WithLabelValues(r.Lookup).Inc()
	}
}

// errNotRunning is reported by /live before Run starts and after it returns.
var errNotRunning = errors.New("agent not running")

// Handler serves the admin endpoints: /live (200 while Run runs, unless the runtime's CRI has
// refused every call for two minutes), /ready (200 once the watches have synced) and /metrics
// (Prometheus text format).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /live", func(w http.ResponseWriter, _ *http.Request) {
		if !a.running.Load() {
			http.Error(w, errNotRunning.Error(), http.StatusServiceUnavailable)
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
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.registry, promhttp.HandlerOpts{}))
	return mux
}
