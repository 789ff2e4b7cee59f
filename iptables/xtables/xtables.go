// Package xtables applies a Ruleset with the iptables binaries (iptables-legacy, iptables-nft or
// plain iptables): one `iptables-restore --noflush` transaction per family. `*-save` runs only
// when our chains may exist, which the kernel tells without a process (/proc's legacy table
// names, iptables-nft's chains over netlink). It never decides which rules exist.
//
// # Tests
//
// As root: apply, re-apply, change and cleanup in a namespace; an IPv6 failure rolls back IPv4;
// restore errors quote the payload lines; the fallback within a backend.
package xtables

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
	"github.com/kubemesh/proxy-init/iptables/internal/errclass"
	"github.com/kubemesh/proxy-init/iptables/nfnl"
)

// Options configure an Applier.
type Options struct {
	// Wait makes iptables-restore wait for the xtables lock, at most WaitTimeout.
	Wait bool
}

// WaitTimeout bounds the wait for the xtables lock: long enough to outlast another writer, short
// enough that a stuck lock fails the pod visibly.
const WaitTimeout = 10 * time.Second

// Applier writes rules through one set of iptables binaries.
type Applier struct {
	name    string
	backend iptables.Backend
	bins    map[iptables.Family]binaries
	opts    Options
}

type binaries struct{ restore, save string }

var _ iptables.Applier = (*Applier)(nil)

// New returns the applier for mode legacy, nft or plain. Without the mode's own binaries it falls
// back within the same backend (nft mode with only an nf_tables-backed "iptables").
func New(mode iptables.Mode, opts Options) (*Applier, error) {
	var prefix string
	var backend iptables.Backend
	switch mode {
	case iptables.ModeLegacy:
		prefix, backend = "-legacy", iptables.BackendLegacy
	case iptables.ModeNFT:
		prefix, backend = "-nft", iptables.BackendNFT
	case iptables.ModePlain:
		f, err := DetectPlain()
		if err != nil {
			return nil, err
		}
		prefix, backend = "", f
	default:
		return nil, fmt.Errorf("iptables mode %q is not served by the iptables binaries", mode)
	}
	a := &Applier{name: "iptables" + prefix, backend: backend, opts: opts, bins: map[iptables.Family]binaries{}}
	for _, f := range families {
		cmd := command(f)
		b, ok := lookPair(cmd + prefix)
		if !ok && prefix != "" {
			// Fall back to the plain binaries, but only if they drive the same kernel backend.
			if be, err := backendOf(cmd); err == nil && be == backend {
				b, ok = lookPair(cmd)
			}
		}
		if !ok {
			return nil, fmt.Errorf("%s%s-restore and %s%s-save not found in PATH (%s), nor a plain %s that is %s to fall back on",
				cmd, prefix, cmd, prefix, os.Getenv("PATH"), cmd, backend)
		}
		a.bins[f] = b
	}
	return a, nil
}

// lookPair finds name-restore and name-save, the second first beside the first (one package):
// every PATH entry searched in vain is a system call.
func lookPair(name string) (binaries, bool) {
	restore, err := exec.LookPath(name + "-restore")
	if err != nil {
		return binaries{}, false
	}
	save := filepath.Join(filepath.Dir(restore), name+"-save")
	if st, err := os.Stat(save); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		if save, err = exec.LookPath(name + "-save"); err != nil {
			return binaries{}, false
		}
	}
	return binaries{restore, save}, true
}

// DetectPlain tells which backend the plain "iptables" binary writes.
func DetectPlain() (iptables.Backend, error) { return backendOf("iptables") }

// backendOf reads the backend from the alternatives symlink chain, or else the binary's version.
func backendOf(cmd string) (iptables.Backend, error) {
	p, err := exec.LookPath(cmd)
	if err != nil {
		return "", fmt.Errorf("%s not found in PATH (%s)", cmd, os.Getenv("PATH"))
	}
	if target, err := filepath.EvalSymlinks(p); err == nil {
		base := filepath.Base(target)
		switch {
		case strings.Contains(base, "legacy"):
			return iptables.BackendLegacy, nil
		case strings.Contains(base, "nft"):
			return iptables.BackendNFT, nil
		}
	}
	// go-iptables parses this same output but keeps the mode private, so read it here.
	out, err := exec.Command(p, "--version").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("probe %s --version: %w: %s", p, err, strings.TrimSpace(string(out)))
	}
	switch {
	case strings.Contains(string(out), "(nf_tables)"):
		return iptables.BackendNFT, nil
	case strings.Contains(string(out), "(legacy)"):
		return iptables.BackendLegacy, nil
	}
	return "", fmt.Errorf("%s --version printed %q, which names neither legacy nor nf_tables", p, strings.TrimSpace(string(out)))
}

// Name is the binary family in use, e.g. "iptables-nft".
func (a *Applier) Name() string { return a.name }

// Covers names the backend the binaries write: iptables-legacy's or iptables-nft's rules.
func (a *Applier) Covers() []iptables.Backend { return []iptables.Backend{a.backend} }

// Apply makes our rules exactly rs, one restore per family, rolling back earlier families if a
// later one fails, and the failing one too where it spans tables (a restore commits per table).
func (a *Applier) Apply(ctx context.Context, rs *iptables.Ruleset) (iptables.Result, error) {
	if err := a.capable("write the " + a.name + " nat rules"); err != nil {
		return iptables.Result{}, err
	}
	applied := map[iptables.Family]iptables.SavedState{} // what each family held before
	var res iptables.Result
	for _, f := range families {
		cur, err := a.read(ctx, f)
		if err != nil {
			return res, errors.Join(err, a.rollback(ctx, applied))
		}
		// Nothing of ours in place (a fresh pod) cannot match; skip comparing line by line.
		if cur.Empty() && !rs.HasFamily(f) || !cur.Empty() && rs.HasFamily(f) && rs.Compare(f, cur).Empty() {
			continue
		}
		target := rs.Saved(f)
		if err := a.restore(ctx, f, iptables.TransitionPayload(cur, target)); err != nil {
			if len(cur.Tables()) > 1 || len(target.Tables()) > 1 {
				applied[f] = cur
			}
			return res, errors.Join(err, a.rollback(ctx, applied))
		}
		res.Changed = true
		applied[f] = cur
	}
	return res, nil
}

// rollback returns each family Apply changed, wholly or in part, to its state before.
func (a *Applier) rollback(ctx context.Context, applied map[iptables.Family]iptables.SavedState) error {
	var errs []error
	var back []string
	for _, f := range families {
		prev, ok := applied[f]
		if !ok {
			continue
		}
		now, err := a.read(ctx, f)
		if err == nil && slices.Equal(now.Rules, prev.Rules) && slices.Equal(now.Chains, prev.Chains) {
			continue // the failed restore committed nothing
		}
		if err == nil {
			err = a.restore(ctx, f, iptables.TransitionPayload(now, prev))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("roll back %s: %w", f, err))
			continue
		}
		back = append(back, string(f))
	}
	if len(errs) == 0 && len(back) > 0 {
		return fmt.Errorf("rolled back %s to the rules it had before", strings.Join(back, " and "))
	}
	return errors.Join(errs...)
}

// Show reads back our rules and compares them with rs (a family rs omits should hold none).
func (a *Applier) Show(ctx context.Context, rs *iptables.Ruleset) (iptables.State, error) {
	st := iptables.State{Backend: a.name, PerFamily: true}
	if err := a.capable("read the " + a.name + " nat rules"); err != nil {
		return st, err
	}
	saved, err := a.readAll(ctx)
	for _, f := range families[:len(saved)] {
		st.Families = append(st.Families, rs.FamilyState(f, saved[f]))
	}
	return st, err
}

// Holding reads what of ours the backend holds, per family, for show to inspect without a config.
func (a *Applier) Holding(ctx context.Context) (iptables.Holding, error) {
	h := iptables.Holding{Backend: a.backend, PerFamily: true, Saved: map[iptables.Family]iptables.SavedState{}}
	err := a.capable("read the " + a.name + " rules")
	if err == nil {
		h.Saved, err = a.readAll(ctx)
	}
	return h, err
}

// Present lists what Cleanup would remove, each line prefixed with its family.
func (a *Applier) Present(ctx context.Context) ([]iptables.Elsewhere, error) {
	saved, err := a.readAll(ctx)
	if err != nil {
		return nil, err
	}
	return iptables.Holding{Backend: a.backend, Saved: saved}.Elsewhere(), nil
}

var families = []iptables.Family{iptables.IPv4, iptables.IPv6}

// command is a family's iptables command. A function, not a map: the CNI plugin links this package
// and runs no package initialiser of ours.
func command(f iptables.Family) string {
	if f == iptables.IPv6 {
		return "ip6tables"
	}
	return "iptables"
}

// readAll reads both families' rules of ours, stopping at the first that fails.
func (a *Applier) readAll(ctx context.Context) (map[iptables.Family]iptables.SavedState, error) {
	saved := map[iptables.Family]iptables.SavedState{}
	for _, f := range families {
		cur, err := a.read(ctx, f)
		if err != nil {
			return saved, err
		}
		saved[f] = cur
	}
	return saved, nil
}

// Cleanup removes our chains and the jumps to them, in both families.
func (a *Applier) Cleanup(ctx context.Context) error {
	if err := a.capable("remove the " + a.name + " nat rules"); err != nil {
		return err
	}
	var errs []error
	for _, f := range families {
		cur, err := a.read(ctx, f)
		if err == nil && !cur.Empty() {
			err = a.restore(ctx, f, iptables.TransitionPayload(cur, iptables.SavedState{}))
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// capable checks that the process has the capabilities the binaries need: without them they fail
// saying not why ("unable to initialize table 'nat'"), or iptables-legacy-save prints nothing.
func (a *Applier) capable(op string) error {
	need := []string{errclass.NetAdmin}
	if a.backend == iptables.BackendLegacy {
		need = append(need, errclass.NetRaw) // its raw socket
	}
	if missing := errclass.Missing(need...); len(missing) > 0 {
		return errclass.Denied(op, fmt.Errorf("the process lacks %s", strings.Join(missing, " and ")), need...)
	}
	return nil
}

// read returns our rules in place for family f, saving only the tables that may hold them, each
// apart: saving all lists the table names in /proc, which a pod's user namespace may not read.
func (a *Applier) read(ctx context.Context, f iptables.Family) (iptables.SavedState, error) {
	var all strings.Builder
	for _, t := range a.mayHaveRules(ctx, f) {
		b := a.bins[f]
		out, stderr, err := run(ctx, b.save, []string{"-t", t}, "", false)
		if err != nil {
			return iptables.SavedState{}, fmt.Errorf("%s -t %s: %w: %s", b.save, t, err, strings.TrimSpace(string(stderr)))
		}
		all.Write(out)
	}
	if all.Len() == 0 {
		return iptables.SavedState{}, nil
	}
	return iptables.ParseSave(all.String()), nil
}

// run executes the program at path with args and input, and returns its standard output and
// error (both in out when combined). The streams are memory files, not pipes, whose copying
// goroutines' threads cost a short-lived process (docs/performance.md); where seccomp refuses
// memfd_create, pipes it is. ctx's end kills the program.
func run(ctx context.Context, path string, args []string, input string, combined bool) (out, stderr []byte, err error) {
	files := make([]*os.File, 0, 3)
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, name := range []string{"stdin", "stdout", "stderr"} {
		fd, err := memfdCreate(name, unix.MFD_CLOEXEC)
		if err != nil {
			return runPiped(exec.CommandContext(ctx, path, args...), input, combined)
		}
		files = append(files, os.NewFile(uintptr(fd), name))
	}
	if _, err := files[0].WriteAt([]byte(input), 0); err != nil { // the child reads from offset 0
		return nil, nil, err
	}
	errOut := files[2]
	if combined {
		errOut = files[1]
	}
	runErr := forkWait(ctx, path, args, files[0], files[1], errOut)
	for i, dst := range []*[]byte{&out, &stderr} {
		if *dst, err = io.ReadAll(io.NewSectionReader(files[i+1], 0, 1<<40)); err != nil {
			return nil, nil, err
		}
	}
	return out, stderr, runErr
}

// forkWait runs the program with syscall.ForkExec (os/exec's first costs a fork to probe pidfd,
// and a thread) and waits. It inherits the namespace's lock (runner.Lock). When ctx ends first it
// is killed, and reaped only once no kill can reach a reused pid.
func forkWait(ctx context.Context, path string, args []string, stdin, stdout, stderr *os.File) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	pid, err := syscall.ForkExec(path, append([]string{path}, args...), &syscall.ProcAttr{
		Env: os.Environ(), Files: []uintptr{stdin.Fd(), stdout.Fd(), stderr.Fd()},
	})
	if err != nil {
		return &os.PathError{Op: "fork/exec", Path: path, Err: err}
	}
	var mu sync.Mutex // held by a kill, taken before reaping
	reaped := false
	defer context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !reaped {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})()
	// WNOWAIT: the child stays a zombie, its pid not reusable, until Wait4 reaps it.
	for err = unix.EINTR; err == unix.EINTR; {
		err = unix.Waitid(unix.P_PID, pid, &unix.Siginfo{}, unix.WEXITED|unix.WNOWAIT, nil)
	}
	mu.Lock()
	reaped = true
	mu.Unlock()
	var ws syscall.WaitStatus
	for werr := error(syscall.EINTR); werr == syscall.EINTR; {
		if _, werr = syscall.Wait4(pid, &ws, 0, nil); err == nil && werr != syscall.EINTR {
			err = werr
		}
	}
	switch {
	case err != nil:
		return fmt.Errorf("wait for %s: %w", path, err)
	case ws.Exited() && ws.ExitStatus() == 0:
		return nil
	case ctx.Err() != nil:
		return fmt.Errorf("%w (%s)", ctx.Err(), exitError{ws})
	}
	return exitError{ws}
}

// exitError is a program that did not exit 0, described as os/exec describes it.
type exitError struct{ ws syscall.WaitStatus }

func (e exitError) Error() string {
	if e.ws.Signaled() {
		return "signal: " + e.ws.Signal().String()
	}
	return "exit status " + strconv.Itoa(e.ws.ExitStatus())
}

// ExitCode is the exit status, or -1 for a program a signal ended, as *exec.ExitError answers.
func (e exitError) ExitCode() int {
	if e.ws.Signaled() {
		return -1
	}
	return e.ws.ExitStatus()
}

// memfdCreate is unix.MemfdCreate; a test replaces it to take the pipe path.
var memfdCreate = unix.MemfdCreate

func runPiped(cmd *exec.Cmd, input string, combined bool) (out, stderr []byte, err error) {
	var o, e bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(input), &o, &e
	if combined {
		cmd.Stderr = &o
	}
	err = cmd.Run()
	return o.Bytes(), e.Bytes(), err
}

// mayHaveRules answers from the kernel, without exec, which of our tables can hold chains of
// ours; a netlink error leaves the question open: every table.
func (a *Applier) mayHaveRules(ctx context.Context, f iptables.Family) []string {
	if a.backend == iptables.BackendLegacy {
		return LegacyTables(f)
	}
	tables, err := nfnl.OurXTTables(ctx, f)
	if err != nil {
		return []string{iptables.Table, "mangle", "raw"}
	}
	return tables
}

// LegacyTables lists, from /proc, which of our tables exist in iptables-legacy's family f in the
// namespace of the current thread (thread-self: we run on a locked thread that entered it).
func LegacyTables(f iptables.Family) []string {
	file := "/proc/thread-self/net/ip_tables_names"
	if f == iptables.IPv6 {
		file = "/proc/thread-self/net/ip6_tables_names"
	}
	data, err := netnsutil.ReadProc(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil // no legacy module loaded at all; any other error leaves the question open
	}
	var out []string
	names := strings.Fields(string(data))
	for _, t := range iptables.XTTables() {
		if err != nil || slices.Contains(names, t.Name) {
			out = append(out, t.Name)
		}
	}
	return out
}

// LegacyMissing says why the kernel offers no iptables-legacy for family f in the calling
// thread's namespace (kernels from 6.17 build it only with CONFIG_NETFILTER_XTABLES_LEGACY, and
// the binaries then fail naming nothing), or is nil where it does or cannot tell. Both signs are
// asked: no table list in /proc, and the socket option refused with ENOPROTOOPT; it is asked with
// a wrong-sized buffer, which a kernel with the handler refuses with EINVAL, loading no table.
func LegacyMissing(f iptables.Family) error {
	file, domain, level, opt := "/proc/thread-self/net/ip_tables_names", unix.AF_INET, unix.IPPROTO_IP, "IPT_SO_GET_INFO"
	if f == iptables.IPv6 {
		file, domain, level, opt = "/proc/thread-self/net/ip6_tables_names", unix.AF_INET6, unix.IPPROTO_IPV6, "IP6T_SO_GET_INFO"
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		return nil
	}
	fd, err := unix.Socket(domain, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil
	}
	defer unix.Close(fd)
	const soGetInfo = 64 // IPT_SO_GET_INFO and IP6T_SO_GET_INFO
	if _, err := unix.GetsockoptString(fd, level, soGetInfo); !errors.Is(err, unix.ENOPROTOOPT) {
		return nil
	}
	return fmt.Errorf("no %s, and the socket option %s is refused: %w", strings.TrimPrefix(file, "/proc/thread-self"), opt, unix.ENOPROTOOPT)
}

// lineNumbers returns the payload line numbers a restore tool names: "line: 2" (iptables-nft) or
// "line 5 failed" (legacy). No regexp: linking it slowed every start-up (docs/performance.md).
func lineNumbers(out string) []int {
	var ns []int
	for _, after := range strings.Split(out, "line")[1:] {
		num := strings.TrimLeft(strings.TrimPrefix(after, ":"), " ")
		end := strings.IndexFunc(num, func(r rune) bool { return r < '0' || r > '9' })
		if end < 0 {
			end = len(num)
		}
		if n, err := strconv.Atoi(num[:end]); err == nil {
			ns = append(ns, n)
		}
	}
	return ns
}

// restore runs one iptables-restore --noflush transaction.
func (a *Applier) restore(ctx context.Context, f iptables.Family, payload string) error {
	b := a.bins[f]
	args := []string{"--noflush"}
	if a.opts.Wait {
		args = append(args, "-w", strconv.Itoa(int(WaitTimeout.Seconds())))
	}
	out, _, err := run(ctx, b.restore, args, payload, true)
	if err != nil {
		return &RestoreError{Binary: b.restore, Family: f, Output: strings.TrimSpace(string(out)), Payload: payload, Err: err}
	}
	return nil
}

// RestoreError is a failed iptables-restore run.
type RestoreError struct {
	Binary  string
	Family  iptables.Family
	Output  string
	Payload string
	Err     error
}

func (e *RestoreError) Error() string {
	msg := fmt.Sprintf("%s (%s) failed: %v: %s", e.Binary, e.Family, e.Err, e.Output)
	lines := strings.Split(e.Payload, "\n")
	for _, n := range lineNumbers(e.Output) {
		if n >= 1 && n <= len(lines) {
			msg += fmt.Sprintf("\n  payload line %d: %s", n, lines[n-1])
		}
	}
	return msg
}

func (e *RestoreError) Unwrap() error { return e.Err }
