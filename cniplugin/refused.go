package cniplugin

// A node whose installer never comes back (its pod evicted, its DaemonSet's update stuck) keeps
// the plugin with a kubeconfig whose token died with the old pod: every ADD fails closed, and the
// kubelet retries quietly. So the first ADD the API server refuses (401 or 403) creates a marker
// file in the state directory, the next that succeeds removes it, and STATUS fails once the marker
// is older than kubernetes.status-unauthorized-after: the node turns NotReady, naming linkerd-cni.
// The bound spares an upgrade's short gap and API blips. A marker older than the kubeconfig (a
// new installer, a rotated token) means nothing.

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kubemesh/proxy-init/internal/rootonly"
)

// DefaultStatusUnauthorizedAfter is kubernetes.status-unauthorized-after's default: well past an
// upgrade's gap, and the kubelet's own grace before it evicts a NotReady node's pods.
const DefaultStatusUnauthorizedAfter = 5 * time.Minute

// RefusedFile is the file, in the state directory, whose modification time is when the API server
// started refusing the plugin's credentials.
const RefusedFile = "api-refused-since"

// StatusUnauthorizedAfter is the effective bound.
func (c *NetConf) StatusUnauthorizedAfter() time.Duration {
	return cmp.Or(c.Kubernetes.StatusUnauthorizedAfter, DefaultStatusUnauthorizedAfter)
}

// noteLookup keeps the marker after an ADD's lookup: created (if absent, so its time is the first
// refusal's) when the API server refused the credentials (401, or 403: an RBAC that no longer
// grants the reads), removed when the lookup worked; other failures say nothing about the
// credentials. Problems are logged: the ADD's answer matters more.
func (c *call) noteLookup(err error) {
	path := filepath.Join(c.conf.StateDir, RefusedFile)
	var se *statusError
	switch {
	case err == nil:
		if rmErr := os.Remove(path); rmErr == nil {
			c.log.Info("the Kubernetes API accepts the plugin's credentials again")
		} else if !errors.Is(rmErr, fs.ErrNotExist) {
			c.log.Warn("cannot remove the credentials-refused marker", "path", path, "error", rmErr)
		}
	case errors.As(err, &se) && (se.Code == http.StatusUnauthorized || se.Code == http.StatusForbidden):
		if mkErr := rootonly.Make(c.conf.StateDir); mkErr != nil {
			c.log.Warn("cannot record that the API server refuses the plugin's credentials", "error", mkErr)
			return
		}
		if fi, statErr := os.Lstat(path); statErr == nil && c.renewedSince(fi.ModTime()) {
			_ = os.Remove(path) // refusals of an older kubeconfig: this one's clock starts now
		}
		f, openErr := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		switch {
		case errors.Is(openErr, fs.ErrExist):
		case openErr != nil:
			c.log.Warn("cannot record that the API server refuses the plugin's credentials", "path", path, "error", openErr)
		default:
			_, _ = fmt.Fprintln(f, time.Now().UTC().Format(time.RFC3339)) // for people; the file's time is what counts
			_ = f.Close()
			c.log.Warn("the Kubernetes API refuses the plugin's credentials; STATUS fails if this lasts",
				"after", c.conf.StatusUnauthorizedAfter(), "marker", path)
		}
	}
}

// refusedTooLong returns STATUS's error when the API server has refused the plugin's credentials
// for longer than the bound, and nil otherwise (no marker, or a young one).
func (c *call) refusedTooLong(now time.Time) error {
	path := filepath.Join(c.conf.StateDir, RefusedFile)
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return nil
	}
	bound := c.conf.StatusUnauthorizedAfter()
	since := fi.ModTime()
	if now.Sub(since) <= bound || c.renewedSince(since) {
		return nil
	}
	return fmt.Errorf("linkerd-cni: the Kubernetes API has refused the plugin's credentials (kubeconfig %s) since %s, more than %s "+
		"(kubernetes.status-unauthorized-after): the linkerd-cni installer has not renewed them on this node (its pod gone, its DaemonSet "+
		"no longer targeting the node or its update stuck), so every pod sandbox here fails; restore the linkerd-cni DaemonSet's pod on this node "+
		"or remove linkerd-cni from the node's CNI config (marker %s)",
		c.conf.Kubernetes.Kubeconfig, since.UTC().Format(time.RFC3339), bound, path)
}

// renewedSince tells whether the kubeconfig was written after t: the installer renewed the
// credentials since, so refusals from before say nothing about them.
func (c *call) renewedSince(t time.Time) bool {
	fi, err := os.Stat(c.conf.Kubernetes.Kubeconfig)
	return err == nil && fi.ModTime().After(t)
}
