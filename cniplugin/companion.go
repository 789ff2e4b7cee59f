package cniplugin

// The node's plugin and its companion. The binary the runtime runs on every pod's sandbox set-up
// (cmd/linkerd-cni built -tags pluginonly) links no Kubernetes client: client-go's package
// initialisation alone would cost it as much as the node agent's whole answer. When a call must
// read the API itself (no agent on the node, or one that did not take the call), the plugin runs
// the companion binary, linkerd-cni-api beside it (cmd/linkerd-cni-api: the same plugin, with the
// API client of package kubeapi), on the same standard input and environment, and the companion's
// result, CNI error and exit status become the call's own. The companion starts only once the
// plugin knows it needs the API, before anything is written, so it does the whole call: the
// lookup, the same failure policy (ADD fails closed), the write and the log lines.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
)

// CompanionName is the companion binary's file name. The installer copies it into the node's CNI
// bin dir beside the plugin; the plugin runs it from its own directory.
const CompanionName = "linkerd-cni-api"

// errNoAPIClient is a call that needs the API in a binary without a client: it goes to the
// companion.
var errNoAPIClient = errors.New("this binary links no Kubernetes API client")

// companionPath is the companion beside this executable.
func companionPath() (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("find the plugin's own directory: %w", err)
	}
	return filepath.Join(filepath.Dir(exe), CompanionName), nil
}

// companion runs the call in the companion binary and passes its result through: what it prints
// on success, its CNI error on failure. A companion that cannot run, or ends without a CNI answer,
// fails the call with an error naming it: ADD and CHECK fail closed, as when the API is
// unreachable, and STATUS reports the plugin unavailable.
func (p *Plugin) companion(c *call) error {
	code, what := uint(types.ErrTryAgainLater), "pod "+c.podName()+" might be meshed and cannot be looked up"
	if c.cmd == "STATUS" {
		code, what = types.ErrPluginNotAvailable, "linkerd-cni cannot look pods up"
	}
	path, err := companionPath()
	if err != nil {
		return c.fail(code, fmt.Errorf("%s: the plugin's API fallback %s: %w", what, CompanionName, err))
	}
	cmd := exec.Command(path)
	cmd.Env = cniEnv(c.cmd, c.args)
	cmd.Stdin = bytes.NewReader(c.args.StdinData)
	var out bytes.Buffer
	errTail := &tailBuffer{max: 2048}
	cmd.Stdout = &out
	cmd.Stderr = io.MultiWriter(p.Stderr, errTail)
	// The companion does this call's work: it must not outlive the plugin when the runtime
	// kills it. The signal follows the thread that started it, which stays locked meanwhile.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	c.log.Debug("the pod is read from the API by the companion binary", "companion", path)
	runtime.LockOSThread()
	runErr := cmd.Run()
	runtime.UnlockOSThread()
	var ee *exec.ExitError
	switch {
	case runErr == nil && (out.Len() > 0 || c.cmd != "ADD"):
		if _, err := p.Stdout.Write(out.Bytes()); err != nil {
			return c.fail(types.ErrIOFailure, fmt.Errorf("write the result: %w", err))
		}
		return nil
	case runErr == nil:
		runErr = errors.New("exited 0 without printing a result")
	case errors.As(runErr, &ee) && ee.ExitCode() == 1:
		// skel's way to fail: the CNI error on stdout, exit 1. It was logged there.
		var ce types.Error
		if json.Unmarshal(out.Bytes(), &ce) == nil && ce.Code != 0 {
			return &ce
		}
		runErr = fmt.Errorf("exited 1 without a CNI error on stdout (%q)", truncate(out.String(), 200))
	}
	if last := errTail.lastLine(); last != "" {
		runErr = fmt.Errorf("%w; its last line on stderr: %s", runErr, last)
	}
	return c.fail(code, fmt.Errorf("%s: the plugin's API fallback %s failed: %w (the linkerd-cni installer copies it beside the plugin)", what, path, runErr))
}

// cniEnv is this process's environment with the call's CNI variables, which are what the
// runtime set (in a test that calls the plugin's methods directly, what the test passed).
func cniEnv(cmd string, a *skel.CmdArgs) []string {
	set := map[string]string{"CNI_COMMAND": cmd, "CNI_CONTAINERID": a.ContainerID, "CNI_NETNS": a.Netns,
		"CNI_IFNAME": a.IfName, "CNI_ARGS": a.Args, "CNI_PATH": a.Path}
	env := make([]string, 0, len(os.Environ())+len(set))
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := set[k]; !ok {
			env = append(env, kv)
		}
	}
	for _, k := range []string{"CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME", "CNI_ARGS", "CNI_PATH"} {
		env = append(env, k+"="+set[k])
	}
	return env
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = t.b[len(t.b)-t.max:]
	}
	return len(p), nil
}

func (t *tailBuffer) lastLine() string {
	lines := strings.Split(strings.TrimSpace(string(t.b)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
