package images

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"crypto/sha256"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// Debian's names of Go's architectures.
var debianArch = map[string]string{
	"amd64": "amd64", "arm64": "arm64", "arm": "armhf", "386": "i386",
	"ppc64le": "ppc64el", "s390x": "s390x", "riscv64": "riscv64",
}

// debSkipped are the parts of a package an image does not need.
var debSkipped = []string{"usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/lintian/", "usr/share/locale/", "usr/share/bug/"}

// DefaultDebCache is where FetchDebs keeps its apt state and the packages it downloaded, one
// directory per architecture, outside the checkout so that every build and test of the machine
// shares it (DEB_CACHE overrides it in the Makefile; Inputs.DebCache in code).
const DefaultDebCache = "/var/cache/proxy-init-images/debian"

// DebPackage is one Debian package of an image.
type DebPackage struct {
	Name, Version, Arch string
	// File is the .deb in the cache.
	File string
}

// aptConf is the private apt configuration of one architecture: apt reads the machine's own
// configuration and sources first, then this, which moves every list, cache and status file
// under dir, sets the architecture, and turns off the machine's hooks (a packagekit or
// docker-clean hook would act on the machine's state) and the index targets an image does not
// need.
const aptConf = `Dir::State "%[1]s/state";
Dir::State::status "%[1]s/state/status";
Dir::Cache "%[1]s/cache";
APT::Architecture "%[2]s";
#clear APT::Architectures;
APT::Architectures { "%[2]s"; };
APT::Sandbox::User "root";
Acquire::Languages "none";
#clear APT::Update::Pre-Invoke;
#clear APT::Update::Post-Invoke;
#clear APT::Update::Post-Invoke-Success;
#clear DPkg::Pre-Invoke;
#clear DPkg::Post-Invoke;
#clear DPkg::Pre-Install-Pkgs;
#clear Acquire::IndexTargets::deb::DEP-11;
#clear Acquire::IndexTargets::deb::DEP-11-icons;
#clear Acquire::IndexTargets::deb::DEP-11-icons-small;
#clear Acquire::IndexTargets::deb::DEP-11-icons-hidpi;
`

// FetchDebs returns pkgs for goarch, at the versions the machine's Debian sources offer,
// downloading into cache only what it does not hold yet. It never changes the machine's apt or
// dpkg state: a private apt directory per architecture (cache/<arch>) holds its own package
// lists, cache and an empty dpkg status, and `apt-get update` runs there only when the lists
// are missing or no longer name a package the mirror still has. A lock file serialises builds
// sharing the cache.
func FetchDebs(cache, goarch string, pkgs []string) ([]DebPackage, error) {
	arch, ok := debianArch[goarch]
	if !ok {
		return nil, fmt.Errorf("architecture %q: no Debian name known", goarch)
	}
	dir := filepath.Join(cmp.Or(cache, DefaultDebCache), arch)
	debs := filepath.Join(dir, "debs")
	for _, d := range []string{"state/lists/partial", "cache/archives/partial", "debs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, fmt.Errorf("the Debian package cache: %w", err)
		}
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("the Debian package cache: %w", err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
		return nil, fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	conf := filepath.Join(dir, "apt.conf")
	if err := os.WriteFile(conf, fmt.Appendf(nil, aptConf, dir, arch), 0o644); err != nil {
		return nil, err
	}
	status := filepath.Join(dir, "state", "status")
	if _, err := os.Stat(status); err != nil {
		if err := os.WriteFile(status, nil, 0o644); err != nil {
			return nil, err
		}
	}
	// apt-get download prints no URI of a file its directory already holds: it asks in an empty
	// one, and downloads into debs.
	empty, err := os.MkdirTemp(dir, "empty-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(empty)
	apt := func(cwd string, args ...string) ([]byte, error) {
		cmd := exec.Command("apt-get", append([]string{"-c", conf, "-q"}, args...)...)
		cmd.Dir = cwd
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return out, fmt.Errorf("apt-get %s (configuration %s): %w\n%s", strings.Join(args, " "), conf, err, stderr.Bytes())
		}
		return out, nil
	}
	fetch := func() ([]DebPackage, error) {
		out, err := apt(empty, append([]string{"download", "--print-uris"}, pkgs...)...)
		if err != nil {
			return nil, err
		}
		want, err := parseURIs(out, pkgs, arch)
		if err != nil {
			return nil, err
		}
		var missing []string
		for _, u := range want {
			if checkSHA256(filepath.Join(debs, u.File), u.sha256) != nil {
				missing = append(missing, u.Name)
			}
		}
		if len(missing) > 0 {
			if _, err := apt(debs, append([]string{"download"}, missing...)...); err != nil {
				return nil, err
			}
		}
		var got []DebPackage
		for _, u := range want {
			u.File = filepath.Join(debs, u.File)
			if err := checkSHA256(u.File, u.sha256); err != nil {
				return nil, err
			}
			got = append(got, u.DebPackage)
		}
		return got, nil
	}
	lists, _ := filepath.Glob(filepath.Join(dir, "state", "lists", "*_Packages*"))
	if len(lists) == 0 {
		if _, err := apt(empty, "update"); err != nil {
			return nil, err
		}
	}
	got, err := fetch()
	if err != nil && len(lists) > 0 {
		// The lists may name versions the mirror has replaced since.
		if _, uerr := apt(empty, "update"); uerr != nil {
			return nil, uerr
		}
		got, err = fetch()
	}
	if err != nil {
		return nil, err
	}
	pruneDebs(debs, got)
	return got, nil
}

// debURI is one line of `apt-get download --print-uris`: 'URI' FILE SIZE SHA256:HEX. apt names
// FILE NAME_VERSION_ARCH.deb from the package lists' fields (the version's colon as %3a), so
// the file's name says which package and version it is; File is that name.
type debURI struct {
	DebPackage
	sha256 string
}

// parseURIs reads `apt-get download --print-uris`, one line per name of pkgs.
func parseURIs(out []byte, pkgs []string, arch string) ([]debURI, error) {
	byName := map[string]debURI{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 4 || !strings.HasPrefix(f[0], "'") {
			continue
		}
		parts := strings.Split(strings.TrimSuffix(f[1], ".deb"), "_")
		sum, ok := strings.CutPrefix(f[3], "SHA256:")
		if !ok || len(parts) != 3 || (parts[2] != arch && parts[2] != "all") || filepath.Base(f[1]) != f[1] {
			return nil, fmt.Errorf("apt-get download --print-uris: unexpected line %q", sc.Text())
		}
		version, err := url.PathUnescape(parts[1])
		if err != nil {
			return nil, fmt.Errorf("apt-get download --print-uris: unexpected line %q: %w", sc.Text(), err)
		}
		byName[parts[0]] = debURI{DebPackage{Name: parts[0], Version: version, Arch: parts[2], File: f[1]}, sum}
	}
	var uris []debURI
	for _, p := range pkgs {
		u, ok := byName[p]
		if !ok {
			return nil, fmt.Errorf("apt-get download --print-uris named no file for Debian package %s (%s)", p, arch)
		}
		uris = append(uris, u)
	}
	return uris, nil
}

// checkSHA256 reports whether the file at p has the SHA-256 sum want (hex).
func checkSHA256(p, want string) error {
	data, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if got := fmt.Sprintf("%x", sha256.Sum256(data)); got != want {
		return fmt.Errorf("%s: SHA-256 %s, want %s (from the package lists)", p, got, want)
	}
	return nil
}

// pruneDebs removes the other versions of the packages in keep from the cache directory, so
// that it holds one version of each.
func pruneDebs(dir string, keep []DebPackage) {
	for _, p := range keep {
		old, _ := filepath.Glob(filepath.Join(dir, p.Name+"_*_"+p.Arch+".deb"))
		for _, f := range old {
			if f != p.File {
				os.Remove(f)
			}
		}
	}
}

// addDeb adds the files of Debian package pkg (its data archive, as dpkg would unpack it, less
// documentation) to entries.
func addDeb(entries map[string]*entry, debs []DebPackage, pkg string) error {
	i := slices.IndexFunc(debs, func(d DebPackage) bool { return d.Name == pkg })
	if i < 0 {
		return fmt.Errorf("the Debian package %s: not fetched (see FetchDebs)", pkg)
	}
	d := debs[i]
	out, err := exec.Command("dpkg-deb", "--fsys-tarfile", d.File).Output()
	if err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", d.File, err)
	}
	files, err := readLayer(bytes.NewReader(out))
	if err != nil {
		return fmt.Errorf("%s: %w", d.File, err)
	}
	for _, e := range files {
		name := strings.TrimPrefix(path.Clean(e.hdr.Name), "./")
		skip := slices.ContainsFunc(debSkipped, func(p string) bool { return strings.HasPrefix(name+"/", p) })
		if name == "." || skip {
			continue
		}
		old, ok := entries[name]
		if ok && e.hdr.Typeflag == tar.TypeDir {
			continue // directories are shared between packages
		}
		if ok && old.hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("%s: %s is also in another package", d.File, name)
		}
		if e.hdr.Typeflag == tar.TypeLink {
			e.hdr.Linkname = strings.TrimPrefix(path.Clean(e.hdr.Linkname), "./")
		}
		e.hdr.PAXRecords = nil
		entries[name] = e
	}
	return nil
}
