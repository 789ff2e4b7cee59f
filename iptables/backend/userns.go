package backend

// Pods with their own user namespace (hostUsers: false). The kernel accepts iptables owner-match
// rules (--uid-owner, --gid-owner: the proxy's exemption) in a network namespace only from a
// writer inside the user namespace that owns it, so for the modes that write them (nft, legacy,
// plain) Runner runs the whole operation, lock and choice included, in a helper process inside
// the pod's user namespace (internal/netnsutil starts it and enters the namespaces). Native
// nftables has no such check, and its skuid match maps the UID in the namespace's owner, so
// nftables and auto (which falls back to it when the kernel refuses) work in place.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
)

// Every binary that links the Runner can be its own helper: started under netnsutil.HelperName,
// it serves one request and exits before main runs.
func init() {
	if netnsutil.IsHelper() {
		os.Exit(serveHelper(os.Stdin, os.Stdout, os.Stderr))
	}
}

// The operations a helper runs.
const (
	opApply   = "apply"
	opShow    = "show"
	opCleanup = "cleanup"
)

// helperRequest is what the helper reads on its standard input.
type helperRequest struct {
	Op            string
	Options       Options
	Rules         *iptables.Ruleset `json:",omitempty"`
	NetNSLabel    string
	ChoiceLevel   slog.Level
	Deadline      time.Time
	CloseWaitFile string `json:",omitempty"`
}

// helperResponse is what it writes on its standard output; its log records go to standard error,
// one JSON object a line, and the caller logs them again.
type helperResponse struct {
	Outcome Outcome
	State   iptables.State
	Error   string `json:",omitempty"`
	// Entering marks an Error from entering the namespaces, not from the operation.
	Entering bool `json:",omitempty"`
}

// needsHelper reports whether mode writes xtables owner matches, which a pod's own user namespace
// must write.
func needsHelper(mode iptables.Mode) bool {
	return mode == iptables.ModeNFT || mode == iptables.ModeLegacy || mode == iptables.ModePlain
}

// viaHelper runs op in a helper when the target's network namespace belongs to another user
// namespace and the mode needs one; handled is false when it does not, and the caller goes on in
// this process. A namespace that cannot even be opened is left to the caller, whose error is the
// usual one.
func (r Runner) viaHelper(ctx context.Context, t Target, op string, rs *iptables.Ruleset) (resp helperResponse, handled bool, err error) {
	if r.Enter != nil || !needsHelper(t.Mode) {
		return resp, false, nil
	}
	owner, err := netnsutil.ForeignUserNS(t.NetNS)
	if owner == nil || err != nil {
		return resp, false, nil
	}
	defer owner.Close()
	userns := netnsutil.NSLabel(owner)
	log := t.log().With("userns", userns)
	log.Debug("network namespace owned by another user namespace: writing from a helper inside it", "netns", t.NetNSLabel())
	resp, err = r.runHelper(ctx, t, owner, log, helperRequest{
		Op: op, Options: t.Options, Rules: rs, NetNSLabel: t.NetNSLabel(), ChoiceLevel: t.ChoiceLevel, CloseWaitFile: r.CloseWaitFile,
	})
	switch {
	case err != nil || resp.Entering:
		if err == nil {
			err = errors.New(resp.Error)
		}
		return resp, true, fmt.Errorf("network namespace %s belongs to user namespace %s (a pod with hostUsers: false), and iptables mode %s writes owner-match rules, which the kernel accepts there only from inside that user namespace; entering it failed: %w; iptables mode nftables (or auto) writes there without entering it",
			t.NetNSLabel(), userns, t.Mode, err)
	case resp.Error != "":
		return resp, true, fmt.Errorf("%s (written from inside user namespace %s)", resp.Error, userns)
	}
	return resp, true, nil
}

// runHelper starts the helper, sends req and waits for its response.
func (r Runner) runHelper(ctx context.Context, t Target, owner *os.File, log *slog.Logger, req helperRequest) (helperResponse, error) {
	var resp helperResponse
	exe := r.Helper
	if exe == "" {
		exe = "/proc/self/exe"
	}
	if dl, ok := ctx.Deadline(); ok {
		req.Deadline = dl
	}
	in, err := json.Marshal(req)
	if err != nil {
		return resp, fmt.Errorf("encode the helper's request: %w", err)
	}
	cmd, done, err := netnsutil.HelperCommand(ctx, exe, owner, t.NetNS)
	if err != nil {
		return resp, err
	}
	defer done()
	var out, errOut bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = bytes.NewReader(in), &out, &errOut
	cmd.WaitDelay = time.Second
	runErr := cmd.Run()
	stray := replayLog(ctx, log, &errOut)
	if err := json.Unmarshal(out.Bytes(), &resp); err != nil {
		if runErr == nil {
			runErr = err
		}
		what := strings.TrimSpace(strings.Join(stray, "\n"))
		if what == "" {
			what = "no output"
		}
		return resp, fmt.Errorf("helper %s: %w: %s", exe, runErr, what)
	}
	return resp, nil
}

// replayLog logs the helper's records with log, and returns the lines that were not records (a
// panic, say).
func replayLog(ctx context.Context, log *slog.Logger, r io.Reader) (stray []string) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Bytes()
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.UseNumber()
		var level slog.Level
		var msg string
		var attrs []any
		ok := func() bool {
			if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
				return false
			}
			for dec.More() {
				tok, err := dec.Token()
				if err != nil {
					return false
				}
				var v any
				if err := dec.Decode(&v); err != nil {
					return false
				}
				switch key, _ := tok.(string); key {
				case slog.TimeKey:
				case slog.LevelKey:
					s, _ := v.(string)
					if level.UnmarshalText([]byte(s)) != nil {
						return false
					}
				case slog.MessageKey:
					msg, _ = v.(string)
				default:
					attrs = append(attrs, key, v)
				}
			}
			return true
		}()
		if !ok {
			stray = append(stray, string(line))
			continue
		}
		log.Log(ctx, level, msg, attrs...)
	}
	return stray
}

// serveHelper is the helper's side: it finishes entering the namespaces, then runs the request
// with the real Runner in its own (now the pod's) network namespace, and returns the exit code.
func serveHelper(stdin io.Reader, stdout, stderr io.Writer) int {
	var resp helperResponse
	defer func() {
		if err := json.NewEncoder(stdout).Encode(&resp); err != nil {
			fmt.Fprintln(stderr, "write the response:", err)
		}
	}()
	if err := netnsutil.BecomeHelper(); err != nil {
		resp.Error, resp.Entering = err.Error(), true
		return 1
	}
	var req helperRequest
	if err := json.NewDecoder(stdin).Decode(&req); err != nil {
		resp.Error = "read the request: " + err.Error()
		return 1
	}
	// iptables-legacy takes /run/xtables.lock, which root of the pod's user namespace may not
	// open (it belongs to the host's root). The namespace lock already keeps this namespace's
	// writers apart, as the pod's own init container would be kept by its own /run, so the
	// binaries get a lock file of their own: a memory file, inherited across exec.
	if fd, err := unix.MemfdCreate("xtables.lock", 0); err == nil {
		os.Setenv("XTABLES_LOCKFILE", "/proc/self/fd/"+strconv.Itoa(fd))
	}
	ctx := context.Background()
	if !req.Deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, req.Deadline)
		defer cancel()
	}
	t := Target{
		Options: req.Options, label: req.NetNSLabel, ChoiceLevel: req.ChoiceLevel,
		Log: slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	r := Runner{CloseWaitFile: req.CloseWaitFile}
	var err error
	switch req.Op {
	case opApply:
		resp.Outcome, err = r.Apply(ctx, t, req.Rules)
	case opShow:
		resp.State, err = r.Show(ctx, t, req.Rules)
	case opCleanup:
		resp.Outcome, err = r.Cleanup(ctx, t)
	default:
		err = fmt.Errorf("unknown operation %q", req.Op)
	}
	if err != nil {
		resp.Error = err.Error()
		return 1
	}
	return 0
}
