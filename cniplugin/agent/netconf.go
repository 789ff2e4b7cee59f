package agent

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/kubemesh/proxy-init/cniplugin"
	"github.com/kubemesh/proxy-init/iptables"
)

// PluginType is linkerd-cni's type in the node's conflist.
const PluginType = "linkerd-cni"

// NetConfSource reads the network config the plugin gets, from the node's CNI config directory
// (mounted into the agent's container): the linkerd-cni entry of the file the runtime uses (the
// first in name order), with the list's name and cniVersion, as libcni passes it. The audit
// checks every pod against it, so it is exactly what the next ADD would write.
type NetConfSource struct {
	Dir string

	mu      sync.Mutex
	path    string
	modTime time.Time
	size    int64
	conf    *cniplugin.NetConf
	err     error
}

// Load returns the current config, parsed again only when the file changed.
func (s *NetConfSource) Load() (*cniplugin.NetConf, error) {
	if s == nil {
		return nil, errors.New("no CNI config directory")
	}
	files, err := libcni.ConfFiles(s.Dir, []string{".conf", ".conflist", ".json"})
	if err != nil {
		return nil, fmt.Errorf("read the CNI config directory %s: %w", s.Dir, err)
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no CNI config in %s yet", s.Dir)
	}
	path := files[0] // ConfFiles lists them in name order (os.ReadDir's)
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if path == s.path && fi.ModTime().Equal(s.modTime) && fi.Size() == s.size {
		return s.conf, s.err
	}
	s.path, s.modTime, s.size = path, fi.ModTime(), fi.Size()
	s.conf, s.err = parseNetConf(path)
	return s.conf, s.err
}

func parseNetConf(path string) (*cniplugin.NetConf, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	list, err := libcni.NetworkConfFromBytes(data)
	if err != nil {
		return nil, fmt.Errorf("%s: not a conflist the runtime chains plugins from: %w", path, err)
	}
	for _, p := range list.Plugins {
		if p.Network.Type != PluginType {
			continue
		}
		full, err := libcni.InjectConf(p, map[string]any{"name": list.Name, "cniVersion": list.CNIVersion})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		conf, err := cniplugin.ParseConfig(full.Bytes)
		if err != nil {
			return nil, fmt.Errorf("%s: the linkerd-cni entry: %w", path, err)
		}
		return conf, nil
	}
	return nil, fmt.Errorf("%s does not chain %s yet", path, PluginType)
}

// needsBinaries tells the modes whose rules only the iptables binaries write and read.
func needsBinaries(m iptables.Mode) bool { return m == iptables.ModeLegacy || m == iptables.ModePlain }
