package stress

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kubemesh/proxy-init/proxyinit"
	"github.com/kubemesh/proxy-init/test/cnitest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

var (
	procs = flag.Int("stress.procs", 8, "processes started at once in each concurrent workload")
	kills = flag.Int("stress.kills", 12, "applies killed with SIGKILL per mode and family set")
	churn = flag.Int("stress.churn", 6, "installer restarts (SIGKILL or SIGTERM) in the churn workload")
)

var bins struct {
	once sync.Once
	dir  string
	err  error
}

// binary returns the path of a command of this checkout, built once per test binary.
func binary(t *testing.T, name string) string {
	t.Helper()
	bins.once.Do(func() {
		bins.dir, bins.err = os.MkdirTemp("", "stress-bin-")
		if bins.err == nil {
			bins.err = cnitest.GoBuild(bins.dir, "github.com/kubemesh/proxy-init/cmd/proxy-init", "github.com/kubemesh/proxy-init/cmd/linkerd-cni")
		}
	})
	if bins.err != nil {
		t.Fatalf("build: %v", bins.err)
	}
	return filepath.Join(bins.dir, name)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if bins.dir != "" {
		os.RemoveAll(bins.dir)
	}
	os.Exit(code)
}

// modes are every mode; plain and auto resolve to one of the others, as the host decides.
var modes = []string{"legacy", "nft", "nftables", "plain", "auto"}

// familySets are IPv4 with IPv6, and IPv4 alone.
var familySets = []struct {
	name string
	args []string
}{{"dual-stack", nil}, {"ipv4-only", []string{"--ipv6=false"}}}

func chartArgs(mode string, extra ...string) []string {
	return append([]string{"-p", "4143", "-o", "4140", "-u", "2102", "--inbound-ports-to-ignore", "4190,4191",
		"--iptables-mode", mode, "-w"}, extra...)
}

// proc is one proxy-init run.
type proc struct {
	cmd  *exec.Cmd
	out  bytes.Buffer
	code int
}

func start(t *testing.T, ns *nt.NS, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(binary(t, "proxy-init"), append(args, "--netns", ns.Path())...)}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start proxy-init: %v", err)
	}
	return p
}

func (p *proc) wait() int {
	err := p.cmd.Wait()
	if ee, ok := err.(*exec.ExitError); ok {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			p.code = -int(ws.Signal())
		} else {
			p.code = ee.ExitCode()
		}
	} else if err != nil {
		p.code = -1
	}
	return p.code
}

func run(t *testing.T, ns *nt.NS, args ...string) *proc {
	t.Helper()
	p := start(t, ns, args...)
	p.wait()
	return p
}

// state classifies what the namespace holds against the configuration args describe.
type state string

const (
	complete state = "complete"
	empty    state = "empty"
	half     state = "half"
	corrupt  state = "corrupt"
)

func classify(t *testing.T, ns *nt.NS, args []string) (state, string) {
	t.Helper()
	cmd := exec.Command(binary(t, "proxy-init"), append(append([]string{"show", "--output", "json"}, args...), "--netns", ns.Path())...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var rep proxyinit.ShowReport
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		return corrupt, fmt.Sprintf("show: %v, unreadable report: %v\n%s%s", err, jerr, out, stderr.String())
	}
	switch {
	case rep.Match:
		return complete, ""
	case rep.HalfApplied != "":
		return half, rep.HalfApplied
	}
	for _, f := range rep.Families {
		if len(f.Rules) > 0 {
			return corrupt, string(out)
		}
	}
	if len(rep.Elsewhere) > 0 {
		return corrupt, string(out)
	}
	return empty, ""
}

// tally counts end states and failed runs for one row of the report.
type tally struct {
	runs, failed int
	states       map[state]int
	examples     []string
}

func (c *tally) add(s state, detail string) {
	if c.states == nil {
		c.states = map[state]int{}
	}
	c.states[s]++
	if (s == corrupt || s == half) && len(c.examples) < 2 {
		c.examples = append(c.examples, detail)
	}
}

func (c *tally) String() string {
	var parts []string
	for _, s := range []state{complete, empty, half, corrupt} {
		parts = append(parts, fmt.Sprintf("%s %d", s, c.states[s]))
	}
	return fmt.Sprintf("%4d runs, %3d failed; end states: %s", c.runs, c.failed, strings.Join(parts, ", "))
}

func report(t *testing.T, workload, mode, fams string, c *tally) {
	t.Helper()
	fmt.Printf("stress: %-26s %-9s %-10s %s\n", workload, mode, fams, c)
	if c.states[corrupt] > 0 {
		t.Errorf("%s %s %s: %d corrupt end states, e.g.:\n%s", workload, mode, fams, c.states[corrupt], strings.Join(c.examples, "\n"))
	}
}

// tallyRuns counts the runs that did not exit 0, keeping their output as examples.
func tallyRuns(ps []*proc) *tally {
	c := &tally{runs: len(ps)}
	for _, p := range ps {
		if p.code != 0 {
			c.failed++
			c.examples = append(c.examples, p.out.String())
		}
	}
	return c
}

// concurrently starts every args list at once and waits for all.
func concurrently(t *testing.T, ns *nt.NS, argss [][]string) []*proc {
	t.Helper()
	ps := make([]*proc, len(argss))
	for i, a := range argss {
		ps[i] = start(t, ns, a...)
	}
	for _, p := range ps {
		p.wait()
	}
	return ps
}

func TestStressConcurrentWriters(t *testing.T) {
	nt.RequireRoot(t)
	for _, mode := range modes {
		for _, fs := range familySets {
			t.Run(mode+"/"+fs.name, func(t *testing.T) {
				// Identical applies: all succeed, one complete config.
				ns := nt.NewNS(t)
				args := chartArgs(mode, fs.args...)
				var same [][]string
				for range *procs {
					same = append(same, args)
				}
				c := tallyRuns(concurrently(t, ns, same))
				c.add(classify(t, ns, args))
				check(t, "identical applies", mode, fs.name, c, complete)

				// Different applies: all succeed, and exactly one of the configs is in place.
				ns = nt.NewNS(t)
				configs := [][]string{}
				for i := range 3 {
					configs = append(configs, chartArgs(mode, append(fs.args, "--outbound-ports-to-ignore", fmt.Sprint(5000+i))...))
				}
				var mixed [][]string
				for i := range *procs {
					mixed = append(mixed, configs[i%3])
				}
				c = tallyRuns(concurrently(t, ns, mixed))
				matched := 0
				for _, cfg := range configs {
					if s, _ := classify(t, ns, cfg); s == complete {
						matched++
					}
				}
				if matched == 1 {
					c.add(complete, "")
				} else {
					c.add(corrupt, fmt.Sprintf("%d of 3 configs match", matched))
				}
				check(t, "different applies", mode, fs.name, c, complete)

				// Applies racing cleanups: all succeed; either the config or nothing is left.
				ns = nt.NewNS(t)
				var racing [][]string
				for i := range *procs {
					if i%2 == 0 {
						racing = append(racing, args)
					} else {
						racing = append(racing, append([]string{"cleanup"}, args...))
					}
				}
				c = tallyRuns(concurrently(t, ns, racing))
				c.add(classify(t, ns, args))
				check(t, "applies racing cleanups", mode, fs.name, c, complete, empty)
			})
		}
	}
}

// check reports a row and fails on failed runs or end states outside allowed.
func check(t *testing.T, workload, mode, fams string, c *tally, allowed ...state) {
	t.Helper()
	report(t, workload, mode, fams, c)
	if c.failed > 0 {
		t.Errorf("%s %s %s: %d of %d runs failed, e.g.:\n%s", workload, mode, fams, c.failed, c.runs, strings.Join(c.examples, "\n"))
	}
	for s, n := range c.states {
		if n > 0 && !slices.Contains(allowed, s) && s != corrupt {
			t.Errorf("%s %s %s: %d end states %q, want only %v", workload, mode, fams, n, s, allowed)
		}
	}
}

// halfAllowed says where a kill may leave one family without rules: only where the iptables
// binaries write the families in two transactions, which is legacy alone (nft, plain on an
// nf_tables host and auto write both families in one netlink batch).
var halfAllowed = map[string]bool{"legacy": true}

func TestStressKillDuringApply(t *testing.T) {
	nt.RequireRoot(t)
	for _, mode := range modes {
		for _, fs := range familySets {
			t.Run(mode+"/"+fs.name, func(t *testing.T) {
				ns := nt.NewNS(t)
				args := chartArgs(mode, fs.args...)
				// How long an apply takes here, to spread the kills over it.
				var took []time.Duration
				for range 3 {
					began := time.Now()
					if p := run(t, ns, args...); p.code != 0 {
						t.Fatalf("apply: exit %d\n%s", p.code, p.out.String())
					}
					took = append(took, time.Since(began))
					run(t, ns, append([]string{"cleanup"}, args...)...)
				}
				sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
				window := took[1] * 6 / 5
				c := &tally{runs: *kills}
				notCompleted := 0
				for range *kills {
					p := start(t, ns, args...)
					time.Sleep(rand.N(window))
					_ = p.cmd.Process.Kill()
					p.wait()
					c.add(classify(t, ns, args))
					// A re-run completes whatever the kill left.
					if r := run(t, ns, args...); r.code != 0 {
						notCompleted++
					} else if s, _ := classify(t, ns, args); s != complete {
						notCompleted++
					}
					run(t, ns, append([]string{"cleanup"}, args...)...)
				}
				fmt.Printf("stress: %-26s %-9s %-10s kills spread over %v; re-runs that did not complete: %d\n", "kill -9 during apply", mode, fs.name, window.Round(time.Millisecond), notCompleted)
				allowed := []state{complete, empty}
				if halfAllowed[mode] {
					allowed = append(allowed, half)
				}
				check(t, "kill -9 during apply", mode, fs.name, c, allowed...)
				if notCompleted > 0 {
					t.Errorf("%d re-runs after a kill did not complete the rules", notCompleted)
				}
			})
		}
	}
}
