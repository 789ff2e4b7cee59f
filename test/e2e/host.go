package e2e

import (
	"bufio"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/vishvananda/netlink"
)

// HostState is what the node must leave as it found on the machine: the root network
// namespace's links, routes and netfilter rules, the machine's mounts, its cgroups and its
// sysctls. It is read from the test binary, which runs in the machine's namespaces, and only
// read.
type HostState struct {
	Links   []string
	Routing []string          // ip rule and ip route, both families, every table
	Rules   map[string]string // ruleset per netfilter backend
	Mounts  []string          // mountLines of the machine's mount table
	Cgroups []string          // the top-level cgroups of every hierarchy
	Sysctls map[string]string
}

// volatileSysctls change by themselves, with whatever else runs on the machine.
var volatileSysctls = []string{
	"fs.dentry-state", "fs.file-nr", "fs.inode-nr", "fs.inode-state", "fs.aio-nr", "fs.quota.",
	"kernel.random.", "kernel.ns_last_pid", "kernel.pty.nr", "net.netfilter.nf_conntrack_count",
}

// ReadHostState reads the machine's state.
func ReadHostState() (*HostState, error) {
	s := &HostState{Rules: map[string]string{}, Sysctls: map[string]string{}}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	for _, l := range links {
		s.Links = append(s.Links, fmt.Sprintf("%s (%s, index %d)", l.Attrs().Name, l.Type(), l.Attrs().Index))
	}
	for _, args := range [][]string{
		{"-4", "rule"}, {"-6", "rule"}, {"-4", "route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"},
	} {
		out, err := exec.Command("ip", args...).Output()
		if err != nil {
			return nil, fmt.Errorf("ip %s: %w", strings.Join(args, " "), err)
		}
		s.Routing = append(s.Routing, strings.Split(strings.TrimSpace(string(out)), "\n")...)
	}
	for _, cmd := range [][]string{{"nft", "list", "ruleset"}, {"iptables-legacy-save"}, {"ip6tables-legacy-save"}} {
		out, err := exec.Command(cmd[0], cmd[1:]...).Output()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", cmd[0], err)
		}
		s.Rules[cmd[0]] = dropComments(string(out))
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	s.Mounts = mountLines(string(mounts))
	mps, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	for _, mp := range mps {
		entries, err := os.ReadDir(mp)
		if err != nil {
			return nil, err
		}
		for _, e := range entries {
			if e.IsDir() {
				s.Cgroups = append(s.Cgroups, filepath.Join(mp, e.Name()))
			}
		}
	}
	err = filepath.WalkDir("/proc/sys", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil // an unreadable directory is not the node's doing
		}
		key := strings.ReplaceAll(strings.TrimPrefix(p, "/proc/sys/"), "/", ".")
		for _, v := range volatileSysctls {
			if strings.HasPrefix(key, v) {
				return nil
			}
		}
		if val, err := os.ReadFile(p); err == nil {
			s.Sysctls[key] = string(val)
		}
		return nil
	})
	return s, err
}

// dropComments removes the lines of an *-save dump that carry a time or counters.
func dropComments(dump string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(dump))
	for sc.Scan() {
		if l := sc.Text(); !strings.HasPrefix(l, "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

// Diff lists how now differs from s, one line per difference. ours tells whether a mount line
// (mountLines) is the cluster's doing; the others are left to whoever else runs on the machine.
func (s *HostState) Diff(now *HostState, ours func(mount string) bool) []string {
	var d []string
	list := func(what string, before, after []string) {
		for _, x := range after {
			if !slices.Contains(before, x) {
				d = append(d, what+" added: "+x)
			}
		}
		for _, x := range before {
			if !slices.Contains(after, x) {
				d = append(d, what+" removed: "+x)
			}
		}
	}
	list("link", s.Links, now.Links)
	list("route or rule", s.Routing, now.Routing)
	// Other tests on the machine mount things (their namespaces under /run/netns) while this
	// one runs: a mount counts only when ours says the cluster made it. A namespace file
	// mounted before the cluster existed is never the cluster's, even when one of its
	// namespaces later got the same inode number.
	theirs := func(m string) bool { return !ours(m) }
	theirsBefore := func(m string) bool { return strings.Contains(m, " nsfs ") || !ours(m) }
	list("mount", slices.DeleteFunc(slices.Clone(s.Mounts), theirsBefore), slices.DeleteFunc(slices.Clone(now.Mounts), theirs))
	list("cgroup", s.Cgroups, now.Cgroups)
	for _, k := range slices.Sorted(maps.Keys(s.Rules)) {
		if s.Rules[k] != now.Rules[k] {
			d = append(d, fmt.Sprintf("%s changed:\n%s\nwas:\n%s", k, now.Rules[k], s.Rules[k]))
		}
	}
	keys := slices.Sorted(maps.Keys(s.Sysctls))
	for _, k := range keys {
		if v, ok := now.Sysctls[k]; ok && v != s.Sysctls[k] {
			d = append(d, fmt.Sprintf("sysctl %s: %q, was %q", k, strings.TrimSpace(v), strings.TrimSpace(s.Sysctls[k])))
		}
	}
	return d
}

// mountLines lists the mounts of a mountinfo table, one "mount point, type, source" line each,
// sorted; a namespace file's (nsfs) line also names the namespace, as "net:[inode]".
func mountLines(mountinfo string) []string {
	var lines []string
	for _, line := range strings.Split(strings.TrimSpace(mountinfo), "\n") {
		// mountinfo: ID parent major:minor root mountpoint options [optional...] - fstype source super
		f := strings.Fields(line)
		if sep := slices.Index(f, "-"); sep > 4 && sep+2 < len(f) {
			m := f[4] + " " + f[sep+1] + " " + f[sep+2]
			if f[sep+1] == "nsfs" {
				m += " " + f[3]
			}
			lines = append(lines, m)
		}
	}
	slices.Sort(lines)
	return lines
}

// OursMount tells whether a line of the machine's mount table (mountLines) is the cluster's: a
// namespace file of a node or of a pod, or a mount like one the nodes made in their own mount
// namespaces (which must never propagate to the machine's). It is meant for after Stop.
func (c *Cluster) OursMount(m string) bool {
	f := strings.Fields(m)
	if len(f) == 4 && f[1] == "nsfs" {
		for _, n := range c.Nodes {
			for _, ino := range append([]uint64{n.NetNS, n.MntNS}, n.podNetNS...) {
				if strings.HasSuffix(f[3], fmt.Sprintf(":[%d]", ino)) {
					return true
				}
			}
		}
		return false
	}
	return c.nodeMounts[strings.Join(f[:min(len(f), 2)], " ")]
}

// Leftovers lists what of the cluster is still on the machine after Stop: processes of a node
// (in its namespaces, its cgroups or marked as its), the nodes' namespaces and their pods' (held
// by a process or a bind mount anywhere), and the cgroup root.
func (c *Cluster) Leftovers() ([]string, error) {
	var left []string
	nss := map[uint64]string{}
	for _, n := range c.Nodes {
		pids, err := n.processes()
		if err != nil {
			return nil, err
		}
		for _, pid := range pids {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			left = append(left, fmt.Sprintf("process %d of node %s: %s", pid, n.Name, strings.ReplaceAll(string(cmd), "\x00", " ")))
		}
		nss[n.NetNS] = "node " + n.Name + "'s network namespace"
		nss[n.MntNS] = "node " + n.Name + "'s mount namespace"
		for _, ino := range n.podNetNS {
			nss[ino] = "a pod's network namespace on " + n.Name
		}
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		for _, kind := range []string{"net", "mnt"} {
			if ino, err := nsInode(fmt.Sprintf("/proc/%d/ns/%s", pid, kind)); err == nil && nss[ino] != "" {
				left = append(left, fmt.Sprintf("%s (%d) held by process %d", nss[ino], ino, pid))
			}
		}
		// A namespace kept alive by a bind mount shows as nsfs "net:[inode]" in some mount table.
		mi, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
		if err != nil {
			continue
		}
		for ino, what := range nss {
			if strings.Contains(string(mi), fmt.Sprintf(":[%d]", ino)) {
				left = append(left, fmt.Sprintf("%s (%d) bind-mounted in the mount namespace of process %d", what, ino, pid))
			}
		}
	}
	mps, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	for _, mp := range mps {
		if _, err := os.Stat(filepath.Join(mp, c.CgroupRoot)); err == nil {
			left = append(left, "cgroup "+filepath.Join(mp, c.CgroupRoot))
		}
	}
	slices.Sort(left)
	return slices.Compact(left), nil
}
