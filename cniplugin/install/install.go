// Package install is the linkerd-cni DaemonSet installer behind
// `linkerd-cni install`: it puts the linkerd-cni plugin into a node's CNI
// configuration, keeps it there, and takes it out again.
//
// Run writes the plugin's kubeconfig from the pod's service account (again when the token
// rotates), copies the plugin binary into the node's CNI bin dir, waits for the primary CNI's
// configuration, and appends the plugin to every *.conflist, *.conf and *.json of the net dir (a
// .conf or .json becomes a .conflist). It watches the directories with inotify and re-adds the
// plugin within a second when the primary CNI rewrites its file. At SIGTERM it removes its entry
// from every file, then the binary and the kubeconfig, unless its DaemonSet stays (an upgrade:
// successorComing).
//
// Files are edited as bytes, not decoded and re-encoded: other plugins' keys, order, numbers and
// whitespace survive exactly, and removal is the exact inverse of insertion. Every write is a
// temporary file plus rename.
//
// Limits: the original bytes of a converted .conf live in memory, so after a crash (SIGKILL) the
// next installer can only remove its entry from the .conflist, not turn it back into the .conf. A
// config file that is a symbolic link, or is not valid JSON, is reported and left alone, and the
// installer stays unready; on removal, one that never named linkerd-cni is only a warning.
//
// With Config.NodeTaint it removes that startup taint from its node once every config file
// carries the plugin; never adds it back, not even on uninstall, which would block an upgrade.
//
// # Tests
//
// On directories laid out like the container's mounts: the edits and their inverse, Multus's own
// configs, the standalone config, the plugin log, the order of writes, a real SIGTERM. Against a
// kube-apiserver: the manifests and chart dry-run, the ServiceAccount's exact permissions,
// --node-taint, the decision at SIGTERM. As root: the DaemonSet's containers, a real ADD.
package install

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
)

// fileState is what the installer knows about one config file it manages.
type fileState struct {
	written  [32]byte // hash of what we last wrote or found with our entry: events then echo ours
	orig     []byte   // the content before our entry, put back on removal if unchanged since
	origName string   // for a list we made from a .conf: that .conf's name
}

// installer is one Run. Only the run goroutine touches its fields, except those under mu.
type installer struct {
	cfg   Config
	log   *slog.Logger
	entry *pluginEntry

	files        map[string]*fileState
	reported     map[string][32]byte // problems logged, by file, for the content they were about
	binID        fileID              // of the plugin binary we copied into the node's CNI bin dir
	kubeOK       bool
	waiting      bool          // the "waiting for the primary CNI" line was logged
	taint        *taintRemover // nil without --node-taint
	entryErr     error         // the entry is not a config the plugin accepts: added nowhere (ADDs would fail)
	lastProblems string        // what syncAll last logged: a failure that persists is logged once

	mu     sync.Mutex
	ready  bool
	reason string
}

// Run installs the plugin and keeps it installed until ctx ends, then removes it and returns nil
// (or the removal's errors). It returns an error at once if the configuration, the service account
// credentials or the plugin binary are unusable, and whenever a file watch dies: a restarted
// installer is better than one that no longer sees changes.
func Run(ctx context.Context, cfg Config, log *slog.Logger) error {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	in, err := newInstaller(cfg, log)
	if err != nil {
		return err
	}
	return in.run(ctx)
}

func newInstaller(cfg Config, log *slog.Logger) (*installer, error) {
	log = cmp.Or(log, slog.New(slog.DiscardHandler))
	source, tmpl := "CNI_NETWORK_CONFIG", cfg.NetworkConfig
	if cfg.NetworkConfigFile != "" {
		b, err := os.ReadFile(cfg.NetworkConfigFile)
		if err != nil {
			return nil, fmt.Errorf("CNI_NETWORK_CONFIG_FILE: %w", err)
		}
		source, tmpl = cfg.NetworkConfigFile, string(b)
	}
	if cfg.Namespace == "" {
		if b, err := os.ReadFile(filepath.Join(cfg.ServiceAccountDir, "namespace")); err == nil {
			cfg.Namespace = strings.TrimSpace(string(b))
		}
	}
	if cfg.Namespace == "" {
		log.Warn("POD_NAMESPACE is not set and the service account has no namespace file: " +
			"the installer's own namespace is not added to exclude-namespaces")
	}
	node := cfg.NodeName
	if node == "" {
		node, _ = os.Hostname()
	}
	vars := map[string]string{
		"__KUBECONFIG_FILEPATH__":     cfg.kubeconfigHostPath(),
		"__KUBECONFIG_FILENAME__":     cfg.KubeconfigFileName,
		"__KUBERNETES_SERVICE_HOST__": cfg.ServiceHost,
		"__KUBERNETES_SERVICE_PORT__": cfg.ServicePort,
		"__KUBERNETES_NODE_NAME__":    node,
		"__CNI_MTU__":                 cfg.CNIMTU,
	}
	entry, warnings, err := renderEntry(source, tmpl, vars, cfg.Namespace)
	if err != nil {
		return nil, err
	}
	for _, w := range warnings {
		log.Warn(w)
	}
	in := &installer{
		cfg:      cfg,
		log:      log,
		entry:    entry,
		files:    map[string]*fileState{},
		reported: map[string][32]byte{},
		reason:   "starting",
	}
	// The plugin's own parser decides, so the installer accepts exactly what ADD will.
	if _, err := cniplugin.ParseConfig(entry.raw); err != nil {
		in.entryErr = fmt.Errorf("%s: %w; linkerd-cni is added to no CNI config until it is fixed", source, err)
		log.Error("the plugin's network config is invalid", "error", in.entryErr)
	}
	return in, nil
}

func (in *installer) setReady(ok bool, reason string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if ok != in.ready {
		switch {
		case ok && in.cfg.StandaloneConf != "":
			in.log.Info("ready: linkerd-cni's config is in place for NetworkAttachmentDefinitions", "file", in.cfg.StandaloneConf)
		case ok:
			in.log.Info("ready: linkerd-cni is in every CNI config file")
		default:
			in.log.Info("not ready", "reason", reason)
		}
	}
	in.ready, in.reason = ok, reason
}

func (in *installer) readiness() (bool, string) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.ready, in.reason
}

// watchError explains the inotify limits that make a watch fail.
func watchError(what string, err error) error {
	switch {
	case errors.Is(err, syscall.EMFILE):
		return fmt.Errorf("%s: %w (inotify instance limit reached: raise fs.inotify.max_user_instances)", what, err)
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%s: %w (inotify watch limit reached: raise fs.inotify.max_user_watches)", what, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func (in *installer) run(ctx context.Context) error {
	cfg := &in.cfg
	if cfg.AdminAddr != "-" {
		stop, err := in.serveAdmin()
		if err != nil {
			return err
		}
		defer stop()
	}
	for _, d := range []string{cfg.netDir(), cfg.binDir()} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("create %s: %w", d, err)
		}
	}
	in.sweepTemps()

	// The kubeconfig, then the binary, come first, so no plugin runs without its kubeconfig and no
	// config file names a missing plugin. Failing here is fatal: the kubelet shows it and retries.
	if err := in.syncKubeconfig(); err != nil {
		return err
	}
	if err := in.syncBinary(); err != nil {
		return err
	}
	in.removeCompanion()
	// Watches start after those checks (so a missing service account directory is reported as
	// such) and before the first full sync, so no change after it goes unseen.
	w, err := in.watch()
	if err != nil {
		return err
	}
	defer w.Close()
	if in.entry.logFile != "" {
		go streamLog(ctx, cfg.hostPath(in.entry.logFile), cfg.PluginLogMaxSize, cfg.PluginLogOutput, in.log)
	}
	if cfg.NodeTaint != "" {
		client, err := kubeclient.New(cfg.restConfig())
		if err != nil {
			return fmt.Errorf("--node-taint: %w", err)
		}
		tr := &taintRemover{client: client, kick: make(chan struct{}, 1), done: make(chan struct{})}
		tctx, stop := context.WithCancel(ctx)
		go tr.run(tctx, in)
		// Whatever ends Run, no API call outlives it.
		defer func() { stop(); <-tr.done }()
		in.taint = tr
	}
	in.syncAll()
	return in.loop(ctx, w)
}

// watch watches the net and bin directories, the service account's, and the CA's if elsewhere.
func (in *installer) watch() (*fsnotify.Watcher, error) {
	cfg := &in.cfg
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, watchError("start file watcher", err)
	}
	watched := []string{cfg.netDir(), cfg.binDir(), cfg.ServiceAccountDir}
	if d := filepath.Dir(cfg.KubeCAFile); !cfg.SkipTLSVerify && d != cfg.ServiceAccountDir {
		watched = append(watched, d)
	}
	for _, d := range watched {
		// Adding a directory watched already (two settings may name one) is a no-op.
		if err := w.Add(filepath.Clean(d)); err != nil {
			w.Close()
			return nil, watchError("watch "+d, err)
		}
	}
	return w, nil
}

// loop syncs after each burst of file events and every resync period, until ctx ends or the
// watch fails.
func (in *installer) loop(ctx context.Context, w *fsnotify.Watcher) error {
	cfg := &in.cfg
	debounce := time.NewTimer(time.Hour)
	debounce.Stop()
	resync := time.NewTicker(cfg.Resync)
	defer resync.Stop()
	// The list as it is now: fsnotify drops a directory from it before its removal's event.
	watchedSet := map[string]bool{}
	for _, d := range w.WatchList() {
		watchedSet[filepath.Clean(d)] = true
	}
	for {
		select {
		case <-ctx.Done():
			return in.finish(ctx)
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("file watcher stopped: exiting so the kubelet restarts the installer")
			}
			if watchedSet[filepath.Clean(ev.Name)] && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				return fmt.Errorf("watched directory %s was removed or moved: exiting so the kubelet restarts the installer", ev.Name)
			}
			if strings.HasPrefix(filepath.Base(ev.Name), tmpPrefix) {
				continue
			}
			debounce.Reset(cfg.Debounce)
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("file watcher stopped: exiting so the kubelet restarts the installer")
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				// Events were lost, not the watch: look at everything.
				in.log.Warn("file events were dropped; re-checking every file", "error", err)
				debounce.Reset(cfg.Debounce)
				continue
			}
			return fmt.Errorf("file watcher failed: %w", err)
		case <-debounce.C:
			if !in.syncAll() {
				debounce.Reset(time.Second) // a failure: retry soon even without an event
			}
		case <-resync.C:
			in.syncAll()
		}
	}
}

// finish ends the installer's run: it uninstalls, unless a successor is coming to take over.
func (in *installer) finish(ctx context.Context) error {
	in.setReady(false, "uninstalling")
	if in.taint != nil {
		<-in.taint.done // its context ended too: no removal in flight while the entries go
	}
	keep, why := in.successorComing(context.WithoutCancel(ctx))
	if keep {
		in.log.Info("leaving linkerd-cni, its binary and kubeconfig in place for the next installer", "reason", why)
		return nil
	}
	in.log.Info("uninstalling", "reason", why)
	return in.uninstall()
}

// syncAll syncs everything, updates readiness and reports whether all of it worked; problems are
// logged, and the next sync retries.
func (in *installer) syncAll() bool {
	var problems []string
	if err := in.syncKubeconfig(); err != nil {
		in.log.Error("kubeconfig", "error", err)
		problems = append(problems, err.Error())
	} else if err := in.syncBinary(); err != nil {
		in.log.Error("plugin binary", "error", err)
		problems = append(problems, err.Error())
	}
	waiting := false
	var unlogged []string
	// A bad log_file does not keep the entry out: the plugin then logs to stderr only, and why.
	if err := checkLogFile(in.cfg.MountPrefix, in.entry.logFile); in.entry.logFile != "" && err != nil {
		problems = append(problems, err.Error())
		unlogged = append(unlogged, err.Error())
	}
	if in.entryErr != nil {
		problems = append(problems, in.entryErr.Error()) // logged once, at start
	} else {
		var errs []error
		waiting, errs = in.syncConfigs()
		if err := errors.Join(errs...); err != nil {
			problems = append(problems, err.Error())
		}
		for _, e := range errs {
			if _, ok := e.(loggedError); e != nil && !ok {
				unlogged = append(unlogged, e.Error())
			}
		}
	}
	// Every failure is logged once when it appears, write errors included; problems with a
	// file's content were logged by problem already.
	if p := strings.Join(unlogged, "; "); p != in.lastProblems {
		in.lastProblems = p
		if p != "" {
			in.log.Error("linkerd-cni is not in every CNI config", "problems", p)
		}
	}
	switch {
	case len(problems) > 0:
		in.setReady(false, strings.Join(problems, "; "))
	case waiting:
		in.setReady(false, "waiting for the primary CNI's configuration in "+in.cfg.netDir())
		return true
	default:
		in.setReady(true, "")
		if in.taint != nil {
			in.taint.poke()
		}
	}
	return len(problems) == 0
}

// syncBinary copies the plugin binary unless the copy we made is still there untouched.
func (in *installer) syncBinary() error {
	src := filepath.Join(in.cfg.ContainerBinDir, in.entry.typ)
	dst := filepath.Join(in.cfg.binDir(), in.entry.typ)
	if id, err := statID(dst); err == nil && id == in.binID {
		return nil
	}
	if si, err := os.Stat(src); err == nil {
		if di, err := os.Stat(dst); err == nil && os.SameFile(si, di) {
			return nil // the image's bin dir is the node's
		}
	}
	if err := copyFileAtomic(src, dst); err != nil {
		return fmt.Errorf("plugin binary: %w", err)
	}
	in.noteWrite(dst)
	id, err := statID(dst)
	if err != nil {
		return fmt.Errorf("plugin binary: copy to %s: %w", dst, err)
	}
	in.binID = id
	in.log.Info("installed plugin binary", "path", dst)
	return nil
}

// staleCompanion is the binary older releases' plugin ran to read the API; it reads it itself now.
const staleCompanion = "linkerd-cni-api"

// removeCompanion removes it once the plugin that no longer runs it is in place.
func (in *installer) removeCompanion() {
	path := filepath.Join(in.cfg.binDir(), staleCompanion)
	switch err := os.Remove(path); {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		in.log.Warn("cannot remove the companion binary of an older linkerd-cni", "path", path, "error", err)
	default:
		in.noteWrite(path)
		in.log.Info("removed the companion binary of an older linkerd-cni: the plugin reads the API itself",
			"path", path)
	}
}

// syncKubeconfig writes the kubeconfig unless it is what the current token and CA give.
func (in *installer) syncKubeconfig() error {
	want, err := renderKubeconfig(&in.cfg)
	path, existed := in.cfg.kubeconfigPath(), in.kubeOK
	in.kubeOK = err == nil
	if err != nil || inPlace(path, want, kubeconfigMode) {
		return err
	}
	if err := writeAtomic(path, want, kubeconfigMode, ""); err != nil {
		in.kubeOK = false
		return fmt.Errorf("kubeconfig: %w", err)
	}
	in.noteWrite(path)
	if existed {
		in.log.Info("rewrote kubeconfig (token or CA changed)", "path", path)
	} else {
		in.log.Info("wrote kubeconfig", "path", path, "server", in.cfg.serverURL())
	}
	return nil
}

func (in *installer) noteWrite(path string) {
	if in.cfg.onWrite != nil {
		in.cfg.onWrite(path)
	}
}

// isConfigName reports whether a runtime would read name as a network configuration: containerd
// (go-cni), CRI-O (ocicni) and libcni load *.conf, *.conflist and *.json, the first by name.
func isConfigName(name string) bool {
	return !strings.HasPrefix(name, ".") &&
		(strings.HasSuffix(name, ".conflist") || isSingleName(name))
}

// isSingleName reports whether the runtimes read name as a single plugin unless it holds a list.
func isSingleName(name string) bool {
	return strings.HasSuffix(name, ".conf") || strings.HasSuffix(name, ".json")
}

// listConfigs returns the *.conf, *.conflist and *.json entries of dir, sorted.
func listConfigs(dir string) ([]fs.DirEntry, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list CNI configs: %w", err)
	}
	return slices.DeleteFunc(ents, func(e fs.DirEntry) bool { return !isConfigName(e.Name()) || e.IsDir() }), nil
}

// problem logs a problem with a file once per content version and returns it as an error.
func (in *installer) problem(name string, content []byte, err error) error {
	if big := (*tooBigError)(nil); errors.As(err, &big) {
		content = fmt.Append(nil, big.size) // never read: a new size is logged again
	}
	h := hashOf(content)
	if prev, ok := in.reported[name]; !ok || prev != h {
		in.reported[name] = h
		in.log.Error("cannot add linkerd-cni to a CNI config file; left untouched", "error", err)
	}
	return loggedError{err}
}

// loggedError is a problem problem has logged already.
type loggedError struct{ error }

func (e loggedError) Unwrap() error { return e.error }

// syncConfigs puts our entry into every config file (errs may hold nils); waiting: none yet.
func (in *installer) syncConfigs() (waiting bool, errs []error) {
	dir := in.cfg.netDir()
	if in.cfg.StandaloneConf != "" {
		path := filepath.Join(dir, in.cfg.StandaloneConf)
		if want := in.standalone(); !inPlace(path, want, standaloneMode) {
			if err := writeAtomic(path, want, standaloneMode, ""); err != nil {
				return false, []error{err}
			}
			in.noteWrite(path)
			in.log.Info("wrote linkerd-cni's config alone, for NetworkAttachmentDefinitions", "path", path)
		}
		return false, nil
	}
	ents, err := listConfigs(dir)
	if err != nil {
		return false, []error{err}
	}
	if len(ents) == 0 {
		if !in.waiting {
			in.log.Info("waiting for the primary CNI's configuration", "dir", dir)
			in.waiting = true
		}
		return true, nil
	}
	in.waiting = false
	multus, multusName := findMultus(dir, ents)
	for _, e := range ents {
		errs = append(errs, in.syncFile(e, multus != nil))
	}
	if multus != nil && multus.kind == multusThick {
		errs = append(errs, in.checkMultusPrimary(multusName, multus))
	}
	// Forget files that are gone, converted .confs included (not from the listing above: a
	// conversion just created a file).
	gone := func(name string) bool {
		_, err := os.Lstat(filepath.Join(dir, name))
		return errors.Is(err, fs.ErrNotExist)
	}
	maps.DeleteFunc(in.files, func(name string, _ *fileState) bool { return gone(name) })
	maps.DeleteFunc(in.reported, func(name string, _ [32]byte) bool { return gone(name) })
	return false, errs
}

// findMultus returns the first config that is Multus's (the one the runtime runs) and its name.
func findMultus(dir string, ents []fs.DirEntry) (*multusConf, string) {
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink != 0 {
			continue
		}
		if data, err := readConfig(filepath.Join(dir, e.Name())); err == nil { // a file too big is syncFile's to report
			if m, ok := parseMultus(data); ok {
				return m, e.Name()
			}
		}
	}
	return nil, ""
}

// checkMultusPrimary reports a thick Multus's default network that linkerd-cni cannot be chained
// into here (a list in the net dir is chained by syncFile).
func (in *installer) checkMultusPrimary(name string, m *multusConf) error {
	if !filepath.IsAbs(m.clusterNetwork) {
		return nil // a network name, which Multus resolves itself
	}
	file := filepath.Base(m.clusterNetwork)
	path := filepath.Join(in.cfg.netDir(), file)
	data, err := readConfig(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return in.problem(name, nil, fmt.Errorf("the pods' default network that Multus (%s) runs, %s, is not in %s: linkerd-cni cannot be chained into it from here; "+
			"point DEST_CNI_NET_DIR at that file's directory, or run linkerd-cni as a NetworkAttachmentDefinition (docs/install.md, Multus and OpenShift)", name, m.clusterNetwork, in.cfg.DestNetDir))
	case errors.As(err, new(*tooBigError)):
		return in.problem(file, nil, err)
	case err != nil:
		return fmt.Errorf("read %s: %w", path, err)
	case !isList(data):
		return in.problem(file, data, fmt.Errorf("%s is the default network Multus runs (clusterNetwork in %s) and a single plugin: linkerd-cni could be chained into it only by renaming it to a .conflist, and Multus reads it by its name; "+
			"run linkerd-cni as a NetworkAttachmentDefinition instead (docs/install.md, Multus and OpenShift)", path, name))
	}
	return nil
}

// syncFile chains our entry into one config file. With Multus on the node, a single-plugin file
// is left as it is (Multus finds its files by name), and Multus's own config gets the entry in
// its delegates only (multus.go).
func (in *installer) syncFile(e fs.DirEntry, withMultus bool) error {
	name := e.Name()
	path := filepath.Join(in.cfg.netDir(), name)
	if e.Type()&fs.ModeSymlink != 0 {
		return in.problem(name, nil, fmt.Errorf("%s is a symbolic link: not editing what it points to", path))
	}
	data, err := readConfig(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // gone since the listing; its own event follows
	}
	if errors.As(err, new(*tooBigError)) {
		return in.problem(name, nil, err)
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	h := hashOf(data)
	if st := in.files[name]; st != nil && st.written == h {
		return nil
	}
	add, remove, msg := appendEntry, removeEntries, "added linkerd-cni to CNI config"
	if _, ok := parseMultus(data); ok {
		add, remove, msg = chainMultus, unchainMultus, "added linkerd-cni to the default network Multus runs"
	} else if isSingleName(name) && !isList(data) {
		if withMultus {
			return nil
		}
		return in.convert(name, path, data)
	} else if doc, err := parseList(data); err == nil &&
		!slices.ContainsFunc(doc.types, func(t string) bool { return t != in.entry.typ }) {
		// A chained plugin alone gets no prevResult: every ADD would fail.
		return in.problem(name, data, fmt.Errorf("%s has no plugin for linkerd-cni to chain after: waiting for the primary CNI to fill it", path))
	}
	out, err := add(data, in.entry.typ, in.entry.raw)
	if err != nil {
		return in.problem(name, data, fmt.Errorf("%s: %w", path, err))
	}
	if bytes.Equal(out, data) {
		in.files[name] = &fileState{written: h}
		return nil
	}
	if err := writeLike(path, out, path); err != nil {
		return err
	}
	in.noteWrite(path)
	st := &fileState{written: hashOf(out)}
	if _, n, _ := remove(data, in.entry.typ); n == 0 {
		st.orig = data // no entry of ours in it: uninstall may put it back byte for byte
	}
	in.files[name] = st
	delete(in.reported, name)
	in.log.Info(msg, "path", path)
	return nil
}

// standalone is the plugin's config alone: the entry, with a cniVersion when it has none.
func (in *installer) standalone() []byte {
	members, _ := topMembers(in.entry.raw)
	if _, ok := lookup(members, "cniVersion"); ok {
		return append(slices.Clone(in.entry.raw), '\n')
	}
	out := splice(in.entry.raw, span{1, 1}, []byte(`"cniVersion":"`+standaloneCNIVersion+`",`))
	return append(out, '\n')
}

// standaloneMode is the standalone config's: root's alone, as Istio writes its Multus file for the
// CIS benchmark. Multus, the one reader, runs as root.
const standaloneMode fs.FileMode = 0o600

// convert turns a single-plugin .conf (or .json) into a .conflist carrying our entry, then removes
// the original: the node is never without a network configuration.
func (in *installer) convert(name, path string, data []byte) error {
	stem := strings.TrimSuffix(strings.TrimSuffix(name, ".conf"), ".json")
	target := stem + ".conflist"
	tpath := filepath.Join(in.cfg.netDir(), target)
	out, err := convertConf(data, in.entry.typ, in.entry.raw, stem)
	if err != nil {
		return in.problem(name, data, fmt.Errorf("%s: %w", path, err))
	}
	have, err := readConfig(tpath)
	if errors.As(err, new(*tooBigError)) {
		return in.problem(name, nil, fmt.Errorf("%s cannot become %s: %w", path, target, err))
	}
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return in.problem(name, data, fmt.Errorf("%s: cannot turn it into %s: that file exists and cannot be read: %w", path, tpath, err))
	}
	if err == nil {
		st := in.files[target]
		ours := st != nil && st.origName == name && st.written == hashOf(have)
		if !ours {
			// After a restart: a list holding our entry and one plugin of the .conf's type is our
			// conversion of this .conf or an older version of it: it is redone.
			other, ok := soleOtherPlugin(have, in.entry.typ)
			ours = ok && (sameJSONText(other, data) || hasEntry(have, in.entry.typ) && pluginType(other) == pluginType(data))
		}
		if !ours {
			return in.problem(name, data, fmt.Errorf("%s: cannot turn it into %s: that file already exists", path, tpath))
		}
	}
	if err := writeLike(tpath, out, path); err != nil {
		return err
	}
	in.noteWrite(tpath)
	if err := removeIfExists(path); err != nil {
		return err
	}
	in.files[target] = &fileState{written: hashOf(out), orig: data, origName: name}
	delete(in.files, name)
	delete(in.reported, name)
	in.log.Info("converted CNI config to a list with linkerd-cni", "from", path, "to", tpath)
	return nil
}

// sweepTemps removes, and logs, the temporary files an installer killed mid-write left (a
// kubeconfig's holds a token). Only one installer runs per node, so none is in use.
func (in *installer) sweepTemps() {
	for _, d := range []string{in.cfg.netDir(), in.cfg.binDir()} {
		matches, err := filepath.Glob(filepath.Join(d, tmpPrefix+"*"))
		for _, m := range matches {
			if err := removeIfExists(m); err != nil {
				in.log.Warn("cannot remove temporary files an earlier installer left", "error", err)
				continue
			}
			in.log.Info("removed a temporary file an earlier installer left", "path", m)
		}
		if err != nil { // a bad pattern: a directory name with glob characters
			in.log.Warn("cannot remove temporary files an earlier installer left", "error", err)
		}
	}
}

// uninstall removes our entry from every config file, then the plugin, then its kubeconfig, so no
// config names a missing plugin, nor a plugin runs without its kubeconfig. It returns every error.
func (in *installer) uninstall() error {
	dir := in.cfg.netDir()
	ents, err := listConfigs(dir)
	errs := []error{err} // errors.Join drops the nils
	for _, e := range ents {
		if e.Type()&fs.ModeSymlink != 0 {
			continue
		}
		if err := in.uninstallFile(e.Name()); err != nil {
			in.log.Error("remove linkerd-cni from CNI config", "error", err)
			errs = append(errs, err)
		}
	}
	if in.cfg.StandaloneConf != "" {
		errs = append(errs, removeIfExists(filepath.Join(dir, in.cfg.StandaloneConf)))
	}
	for _, p := range []string{filepath.Join(in.cfg.binDir(), in.entry.typ), in.cfg.kubeconfigPath()} {
		errs = append(errs, removeIfExists(p))
		in.noteWrite(p)
	}
	in.sweepTemps()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	in.log.Info("uninstalled: linkerd-cni removed from every CNI config; binary and kubeconfig removed")
	return nil
}

func (in *installer) uninstallFile(name string) error {
	dir := in.cfg.netDir()
	path := filepath.Join(dir, name)
	data, err := readConfig(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if big := (*tooBigError)(nil); errors.As(err, &big) && in.files[name] == nil {
		// Never read, so never edited: it holds nothing we added.
		in.log.Warn("a CNI config file too big to read was left untouched; it holds no linkerd-cni entry of this installer's", "error", big)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	if st := in.files[name]; st != nil && st.orig != nil && st.written == hashOf(data) {
		// Unchanged since our write: put the original back, byte for byte.
		if st.origName == "" {
			if err := writeLike(path, st.orig, path); err != nil {
				return err
			}
			in.log.Info("restored CNI config", "path", path)
			return nil
		}
		opath := filepath.Join(dir, st.origName)
		if _, err := os.Lstat(opath); errors.Is(err, fs.ErrNotExist) {
			if err := writeLike(opath, st.orig, path); err != nil {
				return err
			}
		}
		if err := removeIfExists(path); err != nil {
			return err
		}
		in.log.Info("restored CNI config", "path", opath, "removed", path)
		return nil
	}
	remove := removeEntries
	if _, ok := parseMultus(data); ok {
		remove = unchainMultus
	} else if isSingleName(name) && !isList(data) {
		return nil // a single plugin: never ours to edit
	}
	out, n, err := remove(data, in.entry.typ)
	if err != nil {
		if in.files[name] == nil && !bytes.Contains(data, []byte(strconv.Quote(in.entry.typ))) {
			// Never edited by us, not even naming the plugin: it holds nothing of ours.
			in.log.Warn("a CNI config that could not be parsed was left untouched; it holds no linkerd-cni entry", "path", path, "error", err)
			return nil
		}
		return fmt.Errorf("%s: %w; left untouched", path, err)
	}
	if n == 0 {
		return nil
	}
	if err := writeLike(path, out, path); err != nil {
		return err
	}
	in.log.Info("removed linkerd-cni from CNI config", "path", path)
	return nil
}
