package nfnl

import (
	"bufio"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/mdlayher/netlink"

	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/test/iptablestest"
	nt "github.com/kubemesh/proxy-init/test/netnstest"
)

// The planner without root: kernel states recorded from real namespaces (the dumps the kernel
// answered our reads with, byte for byte) are decoded and planned from, and the batches compared
// with golden files. `go test ./iptables/nfnl -run TestRecordStates -record` (root) records the
// states anew; -update rewrites the batches.

var (
	record = flag.Bool("record", false, "record testdata/states/*.dump anew from real namespaces (root)")
	update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current output")
)

// scenario is a namespace set up one way, whose state is recorded.
type scenario struct {
	name, about string
	setup       func(t *testing.T, n *nt.NS)
}

func chartRules(t testing.TB) *iptables.Ruleset {
	return iptablestest.Build(t, iptablestest.ChartConfig())
}

func restoreXT(t *testing.T, n *nt.NS, payload func(iptables.Family) string) {
	for _, f := range families {
		bin := "iptables-nft-restore"
		if f == iptables.IPv6 {
			bin = "ip6tables-nft-restore"
		}
		mustRun(t, n, payload(f), bin, "--noflush")
	}
}

var scenarios = []scenario{
	{"empty", "a fresh namespace", func(*testing.T, *nt.NS) {}},
	{"iptables-nft-restore", "iptables-nft-restore of the chart defaults' payloads, both families", func(t *testing.T, n *nt.NS) {
		rs := chartRules(t)
		restoreXT(t, n, func(f iptables.Family) string { return iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f)) })
	}},
	{"ours-iptables-nft", "our iptables-nft rules of the chart defaults", func(t *testing.T, n *nt.NS) {
		applyWith(t, n, New(iptables.BackendNFT, iptables.BackendNFTables), chartRules(t))
	}},
	{"ours-nftables", "our native table of the chart defaults", func(t *testing.T, n *nt.NS) {
		applyWith(t, n, nativeApplier(), chartRules(t))
	}},
	{"leftovers", "another tool's rules in the nat tables, its jump into our chain, and ours twice (iptables-nft-restore)", func(t *testing.T, n *nt.NS) {
		restoreXT(t, n, func(f iptables.Family) string {
			addr := map[iptables.Family]string{iptables.IPv4: "203.0.113.9/32", iptables.IPv6: "2001:db8::9/128"}[f]
			return "*nat\n:FOREIGN - [0:0]\n:PROXY_INIT_OUTPUT - [0:0]\n:PROXY_INIT_REDIRECT - [0:0]\n" +
				"-A PREROUTING -p udp -m udp --dport 53 -j RETURN\n-A OUTPUT -d " + addr + " -j RETURN\n-A OUTPUT -j FOREIGN\n" +
				"-A FOREIGN -p tcp -m tcp --dport 9999 -j RETURN\n-A OUTPUT -j PROXY_INIT_OUTPUT\n" +
				"-A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT\n" +
				"-A PREROUTING -m comment --comment \"proxy-init/install-proxy-init-prerouting\" -j PROXY_INIT_REDIRECT\nCOMMIT\n"
		})
	}},
	{"tampered-nftables", "our native table of the chart defaults, PROXY_INIT_OUTPUT flushed by hand", func(t *testing.T, n *nt.NS) {
		applyWith(t, n, nativeApplier(), chartRules(t))
		mustRun(t, n, "", "nft", "flush chain inet proxy_init PROXY_INIT_OUTPUT")
	}},
	{"both", "the chart defaults in both: iptables-nft-restore's rules and nft -f's native table", func(t *testing.T, n *nt.NS) {
		rs := chartRules(t)
		restoreXT(t, n, func(f iptables.Family) string { return iptables.TransitionPayload(iptables.SavedState{}, rs.Saved(f)) })
		mustRun(t, n, iptablestest.NFTScript(rs.NFT()), "nft", "-f", "-")
	}},
}

// TestRecordStates records every scenario's state, with -record. Otherwise it checks that the
// recordings are complete: every scenario has one.
func TestRecordStates(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			path := filepath.Join("testdata", "states", sc.name+".dump")
			if !*record {
				if _, err := os.Stat(path); err != nil {
					t.Fatalf("no recording of %s (record it as root: go test ./iptables/nfnl -run TestRecordStates -record): %v", sc.name, err)
				}
				return
			}
			nt.RequireRoot(t, "records kernel states in throwaway namespaces")
			n := nt.NewNS(t)
			sc.setup(t, n)
			var rec strings.Builder
			fmt.Fprintf(&rec, "# %s: %s.\n# Recorded by go test ./iptables/nfnl -run TestRecordStates -record: the kernel's answers to our reads\n", sc.name, sc.about)
			fmt.Fprintf(&rec, "# on Linux %s with %s.\n", uname(t), version(t, "iptables-nft", "--version"))
			in(t, n, func() error {
				c, err := dial(ctx(t))
				if err != nil {
					return err
				}
				defer c.close()
				_, err = read(&recorder{src: c, w: &rec}, func(*State) detail { return detail{xt: true, native: true} })
				return err
			})
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, []byte(rec.String()), 0o644); err != nil {
				t.Fatal(err)
			}
		})
	}
}

func uname(t *testing.T) string {
	data, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(data))
}

func version(t *testing.T, name string, args ...string) string {
	out, err := exec.Command(name, args...).Output()
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return strings.TrimSpace(string(out))
}

// TestPlanFromRecordedStates plans every target from every recorded state, without root, and
// compares the batches with testdata/states/<scenario>.batches.
func TestPlanFromRecordedStates(t *testing.T) {
	control := iptablestest.GoldenConfigs()["control-plane"]
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			path := filepath.Join("testdata", "states", sc.name+".dump")
			var out strings.Builder
			for _, tg := range []struct {
				what string
				a    *Applier
				rs   *iptables.Ruleset
			}{
				{"apply iptables-nft (chart defaults)", New(iptables.BackendNFT, iptables.BackendNFTables), chartRules(t)},
				{"apply iptables-nft (control plane)", New(iptables.BackendNFT, iptables.BackendNFTables), iptablestest.Build(t, control)},
				{"apply nftables (chart defaults)", nativeApplier(), chartRules(t)},
				{"cleanup", New(iptables.BackendNFT, iptables.BackendNFTables), nil},
			} {
				s, err := read(&replay{answers: loadRecording(t, path)}, tg.a.want(tg.rs))
				if err != nil {
					t.Fatalf("%s: read the recorded state: %v", tg.what, err)
				}
				b := tg.a.batch(s, tg.rs)
				if b.err != nil {
					t.Fatalf("%s: %v", tg.what, b.err)
				}
				fmt.Fprintf(&out, "## %s\n%s", tg.what, b)
			}
			checkGolden(t, filepath.Join("states", sc.name+".batches"), out.String())
		})
	}
}

// checkGolden compares got with testdata/<name>, or rewrites it under -update.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	iptablestest.CheckGolden(t, filepath.Join("testdata", name), got, *update, "iptables/nfnl")
}

// recorder passes requests to src and writes the answers down.
type recorder struct {
	src source
	w   *strings.Builder
}

func (r *recorder) exchange(reqs ...request) ([][]netlink.Message, error) {
	ans, err := r.src.exchange(reqs...)
	if err != nil {
		return nil, err
	}
	for i, req := range reqs {
		fmt.Fprintf(r.w, "> %s\n", req.key)
		for _, m := range ans[i] {
			fmt.Fprintf(r.w, "< %04x %s\n", uint16(m.Header.Type), hex.EncodeToString(m.Data))
		}
	}
	return ans, nil
}

// replay answers requests from a recording, each key's answers in the order recorded.
type replay struct {
	answers map[string][][]netlink.Message
}

func (r *replay) exchange(reqs ...request) ([][]netlink.Message, error) {
	out := make([][]netlink.Message, len(reqs))
	for i, req := range reqs {
		q := r.answers[req.key]
		if len(q) == 0 {
			return nil, fmt.Errorf("the recording holds no (more) answer to %q", req.key)
		}
		out[i], r.answers[req.key] = q[0], q[1:]
	}
	return out, nil
}

// loadRecording reads a recording: for every request, by key, its answers in order.
func loadRecording(t *testing.T, path string) map[string][][]netlink.Message {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (record it as root: go test ./iptables/nfnl -run TestRecordStates -record)", err)
	}
	defer f.Close()
	out := map[string][][]netlink.Message{}
	var key string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "> "):
			key = line[2:]
			out[key] = append(out[key], []netlink.Message{})
		case strings.HasPrefix(line, "< "):
			typ, data, _ := strings.Cut(line[2:], " ")
			ty, err := strconv.ParseUint(typ, 16, 16)
			if err != nil {
				t.Fatalf("%s: %q: %v", path, line, err)
			}
			b, err := hex.DecodeString(data)
			if err != nil {
				t.Fatalf("%s: %q: %v", path, line, err)
			}
			q := out[key]
			q[len(q)-1] = append(q[len(q)-1], netlink.Message{Header: netlink.Header{Type: netlink.HeaderType(ty)}, Data: b})
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestGoldenBatches holds the batch each writer plans for a namespace holding nothing, for every
// golden config: what --simulate prints without privileges.
func TestGoldenBatches(t *testing.T) {
	for name, c := range iptablestest.GoldenConfigs() {
		rs := iptablestest.Build(t, c)
		for _, a := range []*Applier{New(iptables.BackendNFT, iptables.BackendNFTables), nativeApplier()} {
			t.Run(name+"/"+a.Name(), func(t *testing.T) {
				checkGolden(t, filepath.Join("batch", name+"."+a.Name()), a.PlanFresh(rs, "not read").String())
			})
		}
	}
}
