package cniplugin

// What a pod author controls of a meshed pod's rules (its annotations, its namespace's, its
// control-plane label) is read once, at sandbox set-up, as Linkerd's plugin reads it: ADD records
// what it merged in a root-only file named after the sandbox, and CHECK and the agent's audits
// rebuild the rules from it. A later `kubectl annotate`, which admission rules written for CREATE
// would miss, thus cannot switch a running pod's redirect off; the agent reports the edit. The
// node's network config (the admin's) is not recorded: it applies as it is now. The plugin
// writes the record itself, as it writes rules without the agent too; DEL removes it, and the
// agent sweeps the records of pods gone without a DEL.

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/utils"
	"golang.org/x/sys/unix"

	"github.com/kubemesh/proxy-init/internal/rootonly"
)

// DefaultStateDir is the node directory, only root's, holding the namespaces' lock files (locks/)
// and the pods' records (pods/), when the network config has no state-dir.
const DefaultStateDir = "/var/run/linkerd-cni"

// Subdirectories of the state directory.
const (
	LocksDir   = "locks"
	RecordsDir = "pods"
)

// recordVersion is the version of the record's format; a record of another is not used.
const recordVersion = 1

// maxRecord bounds a record's size: annotations are bounded by the API server (256 KiB for all of
// an object's) and by the node's ceilings.
const maxRecord = 1 << 20

// Inputs are what a pod author controls of a meshed pod's rules, as one lookup read them: the
// honoured annotations of the pod and (when needed) its namespace, and the control-plane label.
type Inputs struct {
	Pod            map[string]string `json:"pod,omitempty"`
	Namespace      map[string]string `json:"namespace,omitempty"`
	ControlPlane   bool              `json:"controlPlane,omitempty"`
	APIServerPorts []string          `json:"apiServerPorts,omitempty"`
}

// Record is the file ADD leaves for a meshed pod's sandbox.
type Record struct {
	V      int    `json:"v"`
	Pod    string `json:"pod"`              // namespace/name
	PodUID string `json:"podUID,omitempty"` // K8S_POD_UID, when the runtime passed it
	Inputs Inputs `json:"inputs"`
}

// honoured returns the annotations of a that the plugin honours, with a value.
func honoured(a map[string]string) map[string]string {
	out := map[string]string{}
	for _, k := range Annotations {
		if v := a[k]; v != "" {
			out[k] = v
		}
	}
	return out
}

func (in Inputs) merge(c *call) (Settings, error) {
	pod := Object{Kind: "pod", Name: c.podName(), Annotations: in.Pod}
	var ns *Object
	if in.Namespace != nil {
		ns = &Object{Kind: "namespace", Name: c.pod.Namespace, Annotations: in.Namespace}
	}
	return Merge(c.conf.Linkerd.Config, c.conf.Ceilings, pod, ns, in.APIServerPorts)
}

// changes names what differs between the recorded inputs and now's, with both values; an
// annotation's value is the pod's, else its namespace's.
func (in Inputs) changes(now Inputs) []string {
	var out []string
	for _, k := range Annotations {
		if was, is := cmp.Or(in.Pod[k], in.Namespace[k]), cmp.Or(now.Pod[k], now.Namespace[k]); was != is {
			out = append(out, fmt.Sprintf("%s (was %s, now %s)", k, shortQuote(was), shortQuote(is)))
		}
	}
	if in.ControlPlane != now.ControlPlane {
		out = append(out, fmt.Sprintf("label %s (was set %v, now %v)", LabelControlPlaneComponent, in.ControlPlane, now.ControlPlane))
	}
	return out
}

func shortQuote(v string) string {
	if v == "" {
		return "unset"
	}
	if len(v) > 64 {
		v = v[:61] + "..."
	}
	return fmt.Sprintf("%q", v)
}

// recordPath is the record's file, for a sandbox ID that is a CNI container ID no longer than a
// file name may be: safe as one. Not a regexp with a bounded repetition: compiling {0,254} cost
// every plugin start 2 ms.
func (c *call) recordPath() (string, error) {
	id := c.args.ContainerID
	if len(id) > 255 || utils.ValidateContainerID(id) != nil {
		return "", fmt.Errorf("container ID %q: not usable as a file name", id)
	}
	return filepath.Join(c.conf.StateDir, RecordsDir, id+".json"), nil
}

// writeRecord records in for the call's sandbox, atomically (a whole file or none), mode 0600.
func (c *call) writeRecord(in Inputs) error {
	path, err := c.recordPath()
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	if err := rootonly.Make(dir); err != nil {
		return fmt.Errorf("the records' directory: %w", err)
	}
	b, _ := json.Marshal(Record{V: recordVersion, Pod: c.podName(), PodUID: c.pod.UID, Inputs: in}) // strings only: no error
	tmp, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("record the pod's settings: %w", err)
	}
	_, err = tmp.Write(b)
	if err = cmp.Or(err, tmp.Close()); err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("record the pod's settings in %s: %w", path, err)
	}
	return nil
}

// readRecord returns the call's record; nil when there is none. A record that is not a regular
// file of this process's user, writable by no one else, for this pod, is an error.
func (c *call) readRecord() (*Record, error) {
	path, err := c.recordPath()
	if err != nil {
		return nil, err
	}
	if err := rootonly.Check(filepath.Dir(path)); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("the records' directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("the pod's record: %w", err)
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != os.Geteuid() || st.Mode&0o022 != 0 {
		return nil, fmt.Errorf("refusing the record %s: not a regular file of uid %d that only it may write", path, os.Geteuid())
	}
	b, err := io.ReadAll(io.LimitReader(f, maxRecord))
	if err != nil {
		return nil, fmt.Errorf("read the record %s: %w", path, err)
	}
	var r Record
	switch err := json.Unmarshal(b, &r); {
	case err != nil:
		return nil, fmt.Errorf("the record %s: %w", path, err)
	case r.V != recordVersion:
		return nil, fmt.Errorf("the record %s: version %d, want %d", path, r.V, recordVersion)
	case r.Pod != c.podName() || (r.PodUID != "" && c.pod.UID != "" && r.PodUID != c.pod.UID):
		return nil, fmt.Errorf("the record %s is of pod %s (uid %s), not of %s (uid %s)", path, r.Pod, r.PodUID, c.podName(), c.pod.UID)
	}
	return &r, nil
}

// removeRecord removes the call's record, if any (DEL).
func (c *call) removeRecord() {
	path, err := c.recordPath()
	if err == nil {
		err = rootonly.Check(filepath.Dir(path))
	}
	if err == nil {
		err = os.Remove(path)
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.log.Warn("could not remove the pod's record", "error", err)
	}
}

// settle replaces the rules of the annotations of the moment with those of the sandbox's record,
// and names what changed since. Without a record (a sandbox older than records, or the record
// lost) the rules are now's.
func (c *call) settle(pl *podRules, err error) (*podRules, []string, error) {
	if pl == nil || !pl.kind.NeedsRules() {
		return pl, nil, err
	}
	rec, rerr := c.readRecord()
	switch {
	case rerr != nil:
		return nil, nil, rerr
	case rec == nil:
		pl.unrecorded = true
		return pl, nil, err
	}
	changed := rec.Inputs.changes(pl.inputs)
	if len(changed) == 0 {
		return pl, nil, err
	}
	c.log.Debug("annotations changed since the sandbox was set up; its recorded ones apply", "changed", strings.Join(changed, "; "))
	s, err := rec.Inputs.merge(c)
	if err != nil {
		return nil, changed, err
	}
	pl.settings, pl.rules, pl.inputs = s, s.Rules, rec.Inputs
	return pl, changed, nil
}

// SweepRecords removes from dir (the state directory's pods/) the records, older than grace, of
// pods that live no longer reports on the node (by namespace/name and UID), or that do not parse,
// and the temporary files of writes cut short, and returns how many it removed.
func SweepRecords(dir string, grace time.Duration, live func(pod, uid string) bool) (int, error) {
	if err := rootonly.Check(dir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	} else if err != nil {
		return 0, fmt.Errorf("the records' directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !info.Mode().IsRegular() || time.Since(info.ModTime()) < grace {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if !strings.HasPrefix(e.Name(), ".tmp-") {
			if !strings.HasSuffix(e.Name(), ".json") {
				continue
			}
			var r Record
			if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &r) == nil && live(r.Pod, r.PodUID) {
				continue
			}
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
