package agent

import (
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// documentedMetrics reads a page's metric table: each row's metric names ("name{label,...}") and
// type, for the rows naming metrics with prefix.
func documentedMetrics(t *testing.T, page, prefix string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", page))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	name := regexp.MustCompile("`(" + prefix + "[^`]*)`")
	for _, l := range strings.Split(string(b), "\n") {
		cells := strings.Split(l, "|")
		if len(cells) < 4 || !strings.Contains(cells[1], "`"+prefix) {
			continue
		}
		for _, m := range name.FindAllStringSubmatch(cells[1], -1) {
			out[m[1]] = strings.TrimSpace(cells[2])
		}
	}
	return out
}

// exported lists the metrics with prefix that m's registry serves, as the tables name them
// ("name{label,...}"), with their type. Vectors get series only once a label set is used, so
// when described is set, each vector field of m counts too, with the labels its Desc declares.
func exported(t *testing.T, m *metrics, prefix string, described bool) map[string]string {
	t.Helper()
	out := map[string]string{}
	fams, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if !strings.HasPrefix(f.GetName(), prefix) {
			continue
		}
		var labels []string
		for _, lp := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, lp.GetName())
		}
		out[withLabels(f.GetName(), labels)] = strings.ToLower(f.GetType().String())
	}
	if !described {
		return out
	}
	desc := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	vecs := []struct {
		typ string
		c   prometheus.Collector
	}{{"counter", m.requests}, {"counter", m.calls}, {"histogram", m.callSeconds}, {"counter", m.lookups}, {"counter", m.writes}}
	// Every vector field of metrics must be among those: a new one fails here until it is added.
	n := 0
	for f := range reflect.TypeFor[metrics]().Fields() {
		if strings.HasSuffix(f.Type.String(), "Vec") {
			n++
		}
	}
	if n != len(vecs) {
		t.Fatalf("metrics has %d vectors, the test knows %d: add the new one to exported", n, len(vecs))
	}
	for _, v := range vecs {
		ch := make(chan *prometheus.Desc, 1)
		v.c.Describe(ch)
		d := desc.FindStringSubmatch((<-ch).String())
		out[withLabels(d[1], strings.Split(d[2], ","))] = v.typ
	}
	return out
}

func withLabels(name string, labels []string) string {
	if len(labels) == 0 || labels[0] == "" {
		return name
	}
	return name + "{" + strings.Join(labels, ",") + "}"
}

// The metric tables of docs/agent.md and docs/validator-and-repair.md name exactly the metrics
// the agent and the repair controller serve, with their labels and types. The repair controller
// serves no socket and takes no plugin reports, so its vectors never get a series and its table
// leaves them out.
func TestMetricTablesMatchTheRegistry(t *testing.T) {
	for _, c := range []struct {
		page, prefix string
		socket       bool
	}{
		{"agent.md", MetricsPrefix, true},
		{"validator-and-repair.md", RepairMetricsPrefix, false},
	} {
		t.Run(c.page, func(t *testing.T) {
			// The agent polls the installer's /ready (the chart's); the repair controller does not.
			got := exported(t, newMetrics(c.prefix, func() float64 { return 0 }, c.socket), c.prefix, c.socket)
			doc := documentedMetrics(t, c.page, c.prefix)
			if !maps.Equal(got, doc) {
				names := slices.Sorted(maps.Keys(got))
				t.Errorf("docs/%s's metric table does not match the registry\nregistry: %v\nregistry types: %v\ndocs: %v", c.page, names, got, doc)
			}
		})
	}
}
