// Package images describes our container images once (Images: every path, its source, mode and
// file capabilities, the entrypoint and user) and builds them from that description without a
// container daemon: as OCI image tarballs that `ctr images import` and `docker load` take
// (`make images`, BuildOCI), and as a root filesystem for the Dockerfiles in deploy/docker, which
// are generated from the same description (Dockerfile) and run this package to assemble it.
//
// Every image is built for each of Platforms from that platform's cross-compiled binaries
// (PlatformBinDir) and written as one OCI image index. The Debian packages of the proxy-init
// image are fetched per architecture through a private apt directory (FetchDebs), which leaves
// the machine's apt and dpkg state alone.
//
// Limits: images are single-layer, linux only, FROM scratch; the Debian packages come from the
// building machine's sources (its release). The proxy-image overlay's layer is built here;
// putting it over Linkerd's image is tools/release's (it needs a registry).
//
// Tests: docs/images.md#tests.
package images

import "io/fs"

// Where binaries come from: paths relative to the build output directory (`make build`'s bin/).
const (
	BinProxyInit  = "proxy-init"
	BinLinkerdCNI = "linkerd-cni"
	BinPlugin     = "plugin/linkerd-cni"
)

// NetCaps are the file capabilities proxy-init and the xtables binaries carry, in setcap's
// syntax: those Linkerd's proxy image gives them, so that a non-root init container holding
// NET_ADMIN and NET_RAW in its bounding set gets them on exec.
const NetCaps = "cap_net_admin,cap_net_raw+eip"

// File is one entry of an image. Exactly one of Bin, Repo, Link, Dir or Debian says what it is.
type File struct {
	Path string
	// Bin is a binary of the build output (one of the Bin* constants).
	Bin string
	// Repo is a file of this repository, relative to its root.
	Repo string
	// Link makes Path a symbolic link to Link; Dir, a directory.
	Link string
	Dir  bool
	// Debian marks a file that one of the image's Debian packages provides; the entry only
	// adds Caps to it.
	Debian bool
	// Mode is the permission bits (default 0755 for binaries and directories, 0644 otherwise).
	Mode fs.FileMode
	// Caps are file capabilities in setcap's syntax, written as the security.capability xattr.
	Caps string
}

// Image is one image's layout and configuration.
type Image struct {
	// Name is the tarball's (bin/images/<Name>.tar) and the Dockerfile's name
	// (deploy/docker/<Name>.Dockerfile).
	Name string
	// Repository is the image name without tag; TagSuffix is appended to the tag.
	Repository, TagSuffix string
	// About says what the image is for, in the Dockerfile's header.
	About string
	Files []File
	// Debian packages are extracted into the image (their dependencies must be listed too:
	// nothing resolves them).
	Debian          []string
	Entrypoint, Cmd []string
	// User is "uid:gid".
	User string
	// OverBase marks a layer that goes over another image (the overlay): it gets none of the
	// base files of a scratch image, and the Dockerfile copies its files one by one.
	OverBase bool
}

// Base files of every image: an /etc/passwd and /etc/group naming root and nobody (some tools
// resolve the running user), and a world-writable /tmp.
var baseFiles = []File{
	{Path: "/etc/passwd", Repo: "deploy/docker/rootfs/etc/passwd"},
	{Path: "/etc/group", Repo: "deploy/docker/rootfs/etc/group"},
	{Path: "/tmp", Dir: true, Mode: fs.ModeSticky | 0o777},
}

// proxyInitFiles are proxy-init under our paths and Linkerd's. The validator is a second copy
// without capabilities: a file with capabilities that the container's bounding set lacks cannot
// be executed at all, and the validator's container drops every capability. The links keep
// their target's capabilities (they belong to the inode), and the programs see the link's name.
var proxyInitFiles = []File{
	{Path: "/usr/local/bin/proxy-init", Bin: BinProxyInit, Caps: NetCaps},
	{Path: "/usr/local/bin/linkerd-network-validator", Bin: BinProxyInit},
	{Path: "/usr/lib/linkerd/linkerd2-proxy-init", Link: "/usr/local/bin/proxy-init"},
	{Path: "/usr/lib/linkerd/linkerd2-network-validator", Link: "/usr/local/bin/linkerd-network-validator"},
}

// Images are the images `make images` builds, in order.
var Images = []Image{
	{
		Name:       "linkerd-cni",
		Repository: "ghcr.io/kubemesh/linkerd-cni",
		About: `The linkerd-cni image: the DaemonSet's binary (install, agent, repair) and what the installer
copies onto the node: the plugin-only build. Linkerd's paths are links to the DaemonSet's binary:
Linkerd's linkerd2-cni chart runs the repair controller as
/usr/lib/linkerd/linkerd-cni-repair-controller, and its image's CMD is
/usr/bin/linkerd2-cni-install. The installer runs as root (the node's CNI directories are
root-owned) with no capability; the node agent as root, with NET_ADMIN and SYS_ADMIN for its
audits (it heals rules inside pods' namespaces), SYS_PTRACE only with its PID fallback, and no
capability for lookups alone; the repair controller as 65534.`,
		Files: []File{
			{Path: "/opt/cni/bin/linkerd-cni", Bin: BinPlugin},
			{Path: "/usr/local/bin/linkerd-cni", Bin: BinLinkerdCNI},
			{Path: "/usr/lib/linkerd/linkerd-cni-repair-controller", Link: "/usr/local/bin/linkerd-cni"},
			{Path: "/usr/bin/linkerd2-cni-install", Link: "/usr/local/bin/linkerd-cni"},
		},
		Entrypoint: []string{"/usr/local/bin/linkerd-cni"},
		Cmd:        []string{"install"},
		User:       "0:0",
	},
	{
		Name:       "proxy-init",
		Repository: "ghcr.io/kubemesh/proxy-init",
		About: `The proxy-init image, for every --iptables-mode: iptables-legacy and iptables-nft from Debian's
packages, with the same file capabilities as proxy-init, so that it runs as nobody (65534)
holding only what the pod grants (NET_ADMIN, NET_RAW). Linkerd's paths are links to it.`,
		Files: append(append([]File{}, proxyInitFiles...),
			File{Path: "/usr/sbin/xtables-legacy-multi", Debian: true, Caps: NetCaps},
			File{Path: "/usr/sbin/xtables-nft-multi", Debian: true, Caps: NetCaps},
			// What Debian's update-alternatives would point at (iptables-nft, as Debian prefers).
			File{Path: "/usr/sbin/iptables", Link: "iptables-nft"},
			File{Path: "/usr/sbin/iptables-save", Link: "iptables-nft-save"},
			File{Path: "/usr/sbin/iptables-restore", Link: "iptables-nft-restore"},
			File{Path: "/usr/sbin/ip6tables", Link: "ip6tables-nft"},
			File{Path: "/usr/sbin/ip6tables-save", Link: "ip6tables-nft-save"},
			File{Path: "/usr/sbin/ip6tables-restore", Link: "ip6tables-nft-restore"},
			// The xtables lock, writable by the non-root user (-w, --use-wait-flag).
			File{Path: "/run", Dir: true},
			File{Path: "/run/xtables.lock", Repo: "deploy/docker/rootfs/run/xtables.lock", Mode: 0o666},
		),
		Debian: []string{
			"iptables", "libip4tc2", "libip6tc2", "libxtables12", "libmnl0", "libnetfilter-conntrack3",
			"libnfnetlink0", "libnftnl11", "libc6", "libgcc-s1", "netbase",
		},
		Entrypoint: []string{"/usr/local/bin/proxy-init"},
		User:       "65534:65534",
	},
	{
		Name:       "proxy-init-nftables",
		Repository: "ghcr.io/kubemesh/proxy-init",
		TagSuffix:  "-nftables",
		About: `The small proxy-init image: the static binary and nothing else, for --iptables-mode nftables and
auto (which writes iptables-nft's rules over netlink when no iptables binary is present). It
runs as nobody with the same file capabilities as the full image.`,
		Files:      proxyInitFiles,
		Entrypoint: []string{"/usr/local/bin/proxy-init"},
		User:       "65534:65534",
	},
}

// Overlay is the layer the proxy-image overlay puts over Linkerd's proxy image: its proxy-init
// (with the capabilities Linkerd gives it) and network validator (none), replaced by ours.
var Overlay = Image{
	Name:     "linkerd-proxy-overlay",
	OverBase: true,
	About: `Linkerd's proxy image with proxy-init and the network validator replaced by ours: a Linkerd 2.20
user changes only proxy.image.name (and version) in the linkerd-control-plane chart.`,
	Files: []File{
		{Path: "/usr/lib/linkerd/linkerd2-proxy-init", Bin: BinProxyInit, Caps: NetCaps},
		{Path: "/usr/lib/linkerd/linkerd2-network-validator", Bin: BinProxyInit},
	},
}
