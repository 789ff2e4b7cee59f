package repair

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MetricsPrefix starts every metric name, as in Linkerd's repair controller.
const MetricsPrefix = "linkerd_cni_repair_controller_"

// metrics live in the controller's own registry, so two controllers (tests) never collide and
// nothing leaks into the global default registry.
type metrics struct {
	registry     *prometheus.Registry
	deleted      prometheus.Counter
	deleteErrors prometheus.Counter
	eventErrors  prometheus.Counter
}

func newMetrics(queueLen func() float64) *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricsPrefix + "deleted_total",
			Help: "Pods deleted because their linkerd-network-validator exited 95.",
		}),
		deleteErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricsPrefix + "delete_errors_total",
			Help: "Failed attempts to delete such a pod (each is retried with back-off).",
		}),
		eventErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: MetricsPrefix + "event_errors_total",
			Help: "Deletions whose Event could not be recorded.",
		}),
	}
	m.registry.MustRegister(m.deleted, m.deleteErrors, m.eventErrors,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: MetricsPrefix + "queue_size",
			Help: "Pods waiting to be repaired, including those waiting for a retry.",
		}, queueLen),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// Handler serves the admin endpoints: /live (200 while Run is running), /ready (200 once the
// pod watch has synced) and /metrics (Prometheus text format).
func (c *Controller) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /live", func(w http.ResponseWriter, _ *http.Request) {
		if !c.running.Load() {
			http.Error(w, errNotRunning.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("live\n"))
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		if !c.Ready() {
			http.Error(w, "pod watch not synced yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(c.metrics.registry, promhttp.HandlerOpts{}))
	return mux
}
