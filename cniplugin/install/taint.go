package install

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"

	"github.com/kubemesh/proxy-init/cniplugin/internal/kubeclient"
	"github.com/kubemesh/proxy-init/cniplugin/repair"
)

// EnvNodeTaint is the environment equivalent of --node-taint.
const EnvNodeTaint = "LINKERD_CNI_NODE_TAINT"

// The optional manifests named in the log when the API server refuses the patch.
const (
	nodeTaintRBACManifest   = "deploy/linkerd-cni/optional/node-taint-rbac.yaml"
	nodeTaintPolicyManifest = "deploy/linkerd-cni/optional/node-taint-policy.yaml"
)

// Retry pacing of the taint removal: quick at first (the API server may be busy), then at most
// every 30s (RBAC may be applied later).
const (
	defaultTaintBackoff    = time.Second
	defaultTaintBackoffMax = 30 * time.Second
	taintAttemptTimeout    = 30 * time.Second
)

// restConfig is rest.InClusterConfig from the installer's settings (the plugin's kubeconfig's
// server, token and CA). client-go re-reads the token file, so the kubelet's rotation is followed.
func (c *Config) restConfig() *rest.Config {
	rc := &rest.Config{
		Host:            c.serverURL(),
		BearerTokenFile: filepath.Join(c.ServiceAccountDir, "token"),
		UserAgent:       "linkerd-cni-install",
		Timeout:         taintAttemptTimeout,
		TLSClientConfig: rest.TLSClientConfig{Insecure: c.SkipTLSVerify},
	}
	if !c.SkipTLSVerify {
		rc.TLSClientConfig.CAFile = c.KubeCAFile
	}
	return rc
}

// taintRemover removes the node's startup taint once the plugin is in place, in its own goroutine
// so that API latency and retries never delay the file watch loop.
type taintRemover struct {
	client *kubeclient.Client
	kick   chan struct{} // buffered 1: "readiness may have become true"
	done   chan struct{} // closed when the goroutine returns
}

// poke tells the remover that the plugin may now be in place; one pending poke is as good as many.
func (tr *taintRemover) poke() {
	select {
	case tr.kick <- struct{}{}:
	default:
	}
}

// run waits for pokes and removes the taint, retrying with back-off, until it is gone (or was never
// there) or ctx ends. Each attempt first checks again on disk (pluginInPlace): a poke may be stale.
func (tr *taintRemover) run(ctx context.Context, in *installer) {
	defer close(tr.done)
	node := in.cfg.NodeName
	log := in.log.With("node", node, "taint", in.cfg.NodeTaint)
	log.Info("will remove the node's startup taint once linkerd-cni is in every CNI config file")
	backoff := in.cfg.taintBackoff
	for {
		select {
		case <-ctx.Done():
			return
		case <-tr.kick:
		}
		for {
			if ok, reason := in.pluginInPlace(); !ok {
				log.Info("not removing the startup taint yet", "reason", reason)
				break // wait for the next poke
			}
			actx, cancel := context.WithTimeout(ctx, taintAttemptTimeout)
			removed, err := repair.RemoveNodeTaint(actx, tr.client, node, in.cfg.NodeTaint)
			cancel()
			if err == nil {
				if removed {
					log.Info("removed the startup taint: linkerd-cni is in place, pods may now be scheduled on this node")
				} else {
					log.Info("the node carries no startup taint; nothing to remove")
				}
				return
			}
			if ctx.Err() != nil {
				return
			}
			args := []any{"error", err, "retry_in", backoff}
			switch {
			case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"):
				args = append(args, "hint", "an admission policy refused the patch: with "+nodeTaintPolicyManifest+
					", the token must be bound to a pod on node "+node+" (is KUBERNETES_NODE_NAME the pod's spec.nodeName?)")
			case apierrors.IsForbidden(err):
				args = append(args, "hint", "the linkerd-cni ServiceAccount needs get and patch on nodes: apply "+nodeTaintRBACManifest)
			case apierrors.IsNotFound(err):
				args = append(args, "hint", "no Node named "+node+": check KUBERNETES_NODE_NAME")
			}
			log.Error("cannot remove the startup taint; retrying", args...)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, in.cfg.taintBackoffMax)
		}
	}
}

// pluginInPlace reports whether the installer is ready and, read again from disk now, the plugin is
// where the runtime will find it: the standalone config, or every config file (with Multus: every
// delegate of its own, single-plugin files aside) as a sync leaves it. That closes the window
// between a primary CNI rewriting its file and the installer's next sync.
func (in *installer) pluginInPlace() (bool, string) {
	if ok, reason := in.readiness(); !ok {
		return false, reason
	}
	dir := in.cfg.netDir()
	if in.cfg.StandaloneConf != "" {
		p := filepath.Join(dir, in.cfg.StandaloneConf)
		if data, err := os.ReadFile(p); err != nil || !bytes.Equal(data, in.standalone()) {
			return false, p + " is not the plugin's config yet"
		}
		return true, ""
	}
	ents, err := listConfigs(dir)
	if err != nil {
		return false, err.Error()
	}
	if len(ents) == 0 {
		return false, "no CNI config file in " + dir
	}
	multus, _ := findMultus(dir, ents)
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		data, err := os.ReadFile(p)
		if err != nil {
			return false, fmt.Sprintf("read %s: %v", p, err)
		}
		add := appendEntry
		if _, ok := parseMultus(data); ok {
			add = chainMultus
		} else if multus != nil && !isList(data) {
			continue // a single plugin, which syncFile leaves alone beside Multus
		}
		// In place: as syncFile leaves it, with nothing left to add.
		if out, err := add(data, in.entry.typ, in.entry.raw); err != nil || !bytes.Equal(out, data) {
			return false, p + " does not run the " + in.entry.typ + " plugin as configured yet"
		}
	}
	return true, ""
}
