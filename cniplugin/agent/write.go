package agent

// Route 1: the agent writes an ADD's rules (wire.WriteVersion requests). The plugin the runtime
// ran passes the pod's network namespace as a descriptor with CNI_NETNS; the agent writes only
// when it can show that the descriptor is a namespace the runtime pinned for a sandbox, and never
// with a config of the caller's:
//
//   - the peer holds CAP_SYS_ADMIN in the initial user namespace (wire.CheckPeer, as for lookups);
//   - the descriptor is a network namespace, neither the agent's own (in the chart it runs in the
//     node's network namespace) nor the node's (its PID 1's, when the node's /proc lets the agent
//     see it);
//   - CNI_NETNS names a file in /var/run/netns (or /run/netns), where containerd and CRI-O pin a
//     sandbox's namespace, and that file, in the agent's read-only mount of the directory, is the
//     descriptor's namespace (same nsfs device and inode);
//   - the network config is the node's own linkerd-cni entry (NetConfSource), the one the audits
//     check against; the request carries only the pod, CNI_NETNS, the container ID and interface.
//
// What the pinned file cannot show is which pod the namespace is for: containerd registers a
// sandbox in the CRI only after its ADD returns, so the runtime cannot be asked. The file shows
// that the runtime made and pinned the namespace for a sandbox, which no process without
// CAP_SYS_ADMIN in the initial user namespace can fake, and the peer holds that capability
// already: with it, it could write any namespace itself. So the agent lends it no power it lacks,
// and writes only what the node's config says, which is what the plugin would write.
//
// A descriptor that fails these checks is refused (logged at warning with the peer's PID); when
// the agent cannot write at all (no capabilities, no node config, a namespace outside the pinned
// directory, a mode whose binaries its image lacks, a write that failed), it declines and sends
// the pod as for a lookup, and the plugin writes.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
	k8stypes "k8s.io/apimachinery/pkg/types"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/cniplugin/wire"
	"github.com/kubemesh/proxy-init/internal/netnsutil"
	"github.com/kubemesh/proxy-init/iptables"
)

// whyNoWrites says why the agent cannot write any pod's rules, or is nil when it can: it needs the
// node's network config and its /var/run/netns (both come with audits) and NET_ADMIN and
// SYS_ADMIN (the chart grants them only with audits).
func (a *Agent) whyNoWrites() *wire.Error {
	switch {
	case a.opts.NetConf == nil:
		return wire.Errorf(wire.CodeCannotWrite, "the agent does not read the node's network config (audits are off: agent.auditPeriod 0s)")
	case a.opts.NetNSDir == "":
		return wire.Errorf(wire.CodeCannotWrite, "the agent has no view of the node's /var/run/netns (--netns-dir; audits are off)")
	}
	var data [2]unix.CapUserData // capabilities 0-31, 32-63
	if err := unix.Capget(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &data[0]); err != nil {
		return wire.Errorf(wire.CodeCannotWrite, "cannot read the agent's capabilities: %v", err)
	}
	return capDecline(uint64(data[1].Effective)<<32 | uint64(data[0].Effective))
}

// capDecline is the decline of an agent whose effective capabilities are capEff, nil when they
// let it write: a capability error (with the agent's own namespace), as the kernel's refusal of
// the write would be.
func capDecline(capEff uint64) *wire.Error {
	if capEff&(1<<unix.CAP_NET_ADMIN) != 0 && capEff&(1<<unix.CAP_SYS_ADMIN) != 0 {
		return nil
	}
	ce := &iptables.CapabilityError{Caps: []string{"CAP_NET_ADMIN", "CAP_SYS_ADMIN"}, NetNS: netnsutil.Current(),
		Op: "write the plugin's ADDs in the node agent", Err: fmt.Errorf("the agent's CapEff is %016x", capEff)}
	return wire.CapabilityErrorf(ce, "the agent does not hold NET_ADMIN and SYS_ADMIN (CapEff %016x; the chart grants them with audits)", capEff)
}

// nsRefs are the namespaces a write may never go to, and where the runtime's pins are seen.
type nsRefs struct {
	// own is the agent's own network namespace; host the node's (its PID 1's), which the agent
	// may be unable to see (a missing or unreadable host is skipped: the chart runs the agent in
	// the node's network namespace, so own is the node's too).
	own, host string
	// pinned is the node's /var/run/netns as the agent sees it.
	pinned string
}

// checkWriteNetNS checks the descriptor f against CNI_NETNS. refuse is set for a descriptor that
// is not a pod's namespace the runtime pinned there (the caller's proof fails); decline when the
// agent cannot tell (CNI_NETNS outside the pinned directory, or not in the agent's view).
func checkWriteNetNS(f *os.File, cniNetns string, refs nsRefs) (refuse, decline *wire.Error) {
	if err := netnsutil.CheckNetNSFile(f); err != nil {
		return wire.Errorf(wire.CodeRefused, "the descriptor attached: %v", err), nil
	}
	var theirs unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &theirs); err != nil {
		return wire.Errorf(wire.CodeRefused, "the descriptor attached: stat: %v", err), nil
	}
	for _, r := range []struct{ path, what string }{
		{refs.own, "the agent's own network namespace (the node's, in the host network)"},
		{refs.host, "the node's network namespace (that of its PID 1)"},
	} {
		var st unix.Stat_t
		err := unix.Stat(r.path, &st)
		switch {
		case err != nil && r.path == refs.own:
			return wire.Errorf(wire.CodeRefused, "cannot tell the descriptor from %s: %v", r.what, err), nil
		case err != nil:
			continue
		case st.Dev == theirs.Dev && st.Ino == theirs.Ino:
			return wire.Errorf(wire.CodeRefused, "the descriptor attached is %s (nsfs inode %d); refusing to write there", r.what, theirs.Ino), nil
		}
	}
	if refs.pinned == "" {
		return nil, nil // the agent writes nothing (whyNoWrites), so has nothing to check it against
	}
	name, ok := netnsName(cniNetns)
	if !ok {
		return nil, wire.Errorf(wire.CodeCannotWrite, "CNI_NETNS %s is not in /var/run/netns, where the agent can tell that the runtime pinned it", cniNetns)
	}
	var pinned unix.Stat_t
	if err := unix.Lstat(filepath.Join(refs.pinned, name), &pinned); err != nil {
		return nil, wire.Errorf(wire.CodeCannotWrite, "CNI_NETNS %s is not in the agent's view of /var/run/netns (%s): %v", cniNetns, refs.pinned, err)
	}
	if pinned.Dev != theirs.Dev || pinned.Ino != theirs.Ino {
		return wire.Errorf(wire.CodeRefused, "the descriptor attached (nsfs inode %d) is not the namespace the runtime pinned at CNI_NETNS %s (inode %d of device %d)",
			theirs.Ino, cniNetns, pinned.Ino, pinned.Dev), nil
	}
	return nil, nil
}

// write answers a write request: the rules written (Written), or why not (Declined, with the pod
// as for a lookup), or a refusal (refuse, which the caller logs and answers).
func (a *Agent) write(ctx context.Context, req wire.Request, netns *os.File) (reply wire.Reply, outcome string, refuse error) {
	refs := nsRefs{own: a.opts.OwnNetNS, host: a.opts.HostNetNS, pinned: a.opts.NetNSDir}
	refusal, decline := checkWriteNetNS(netns, req.Netns, refs)
	if refusal != nil {
		return wire.Reply{}, "", refusal
	}
	if decline == nil {
		decline = a.writeOff
	}
	var conf *cniplugin.NetConf
	if decline == nil {
		var err error
		if conf, err = a.opts.NetConf.Load(); err != nil {
			decline = wire.Errorf(wire.CodeCannotWrite, "no network config of linkerd-cni on the node: %v", err)
		}
	}
	switch {
	case decline != nil:
	case !a.synced.Load():
		decline = wire.Errorf(wire.CodeCannotWrite, "the agent's watches have not synced yet")
	case needsBinaries(conf.Linkerd.Mode) && !a.haveBinaries(conf.Linkerd.Mode):
		decline = wire.Errorf(wire.CodeCannotWrite, "iptables-mode %s is written with the iptables binaries, which the agent's image does not hold", conf.Linkerd.Mode)
	}
	if decline != nil {
		return a.declined(ctx, req, decline)
	}

	// Bounded as an audit is: the plugin stops waiting after its agent.timeout and writes itself,
	// and the namespace's lock keeps the two writes apart.
	ctx, cancel := context.WithTimeout(ctx, auditTimeout)
	defer cancel()
	path := "/proc/self/fd/" + strconv.Itoa(int(netns.Fd()))
	var logs bytes.Buffer
	api := &cacheAPI{a: a, uid: k8stypes.UID(req.UID)}
	w, err := cniplugin.NewAgentWriter(api, a.opts.Runner).AgentAdd(ctx, cniplugin.AgentAdd{Conf: conf,
		Pod:         cniplugin.PodArgs{Namespace: req.Namespace, Name: req.Name, UID: req.UID, InfraContainerID: req.ContainerID},
		ContainerID: req.ContainerID, NetNS: path, Log: &logs})
	a.kubeletAnswered(req, wire.Reply{Source: api.source})
	// Messages name the namespace as the runtime did, not as this process reached it.
	named := func(s string) string { return strings.ReplaceAll(s, path, req.Netns) }
	var nw *cniplugin.NotWrittenError
	switch {
	case errors.As(err, &nw):
		why := wire.Errorf(wire.CodeCannotWrite, "%s", named(err.Error()))
		if ce := (*iptables.CapabilityError)(nil); errors.As(err, &ce) {
			inPod := *ce
			inPod.Op = named(ce.Op)
			why = wire.CapabilityErrorf(&inPod, "%s", why.Message)
		}
		a.log.Warn("could not write a pod's rules; the plugin writes them", "pod", req.Namespace+"/"+req.Name, "container_id", req.ContainerID, "error", why.Message)
		return a.declined(ctx, req, why)
	case err != nil && w.Error == nil:
		// The watch does not hold the pod (or its namespace) yet: the plugin reads the API.
		a.log.Debug("a plugin asked to write for a pod the watch does not hold", "pod", req.Namespace+"/"+req.Name, "error", err.Error())
		return wire.Reply{V: wire.WriteVersion, Error: wire.Errorf(wire.CodeNotSeen, "%v", err)}, string(wire.CodeNotSeen), nil
	}
	if w.Error != nil {
		w.Error.Msg = named(w.Error.Msg)
	}
	w.Log = wire.TruncateLog(named(logs.String()))
	return wire.Reply{V: wire.WriteVersion, Written: &w, Source: api.source}, "write", nil
}

// declined is the reply of a write the agent does not do: the lookup, as for a version-2 request,
// with why.
func (a *Agent) declined(ctx context.Context, req wire.Request, why *wire.Error) (wire.Reply, string, error) {
	a.log.Debug("not writing a pod's rules; the plugin writes them", "pod", req.Namespace+"/"+req.Name, "container_id", req.ContainerID, "why", why.Error())
	reply, outcome := a.answer(ctx, req)
	reply.V, reply.Declined = wire.WriteVersion, why
	return reply, outcome, nil
}
