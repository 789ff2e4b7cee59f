package images

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// Debian's names of Go's architectures.
var debianArch = map[string]string{
	"amd64": "amd64", "arm64": "arm64", "arm": "armhf", "386": "i386",
	"ppc64le": "ppc64el", "s390x": "s390x", "riscv64": "riscv64",
}

// debSkipped are the parts of a package an image does not need.
var debSkipped = []string{"usr/share/doc/", "usr/share/man/", "usr/share/info/", "usr/share/lintian/", "usr/share/locale/", "usr/share/bug/"}

// FetchDebs downloads pkgs for goarch into dir with `apt-get download`, running `apt-get update`
// first if a package is unknown (a fresh machine has no package lists). goarch must be dpkg's
// native architecture or one added with `dpkg --add-architecture`.
func FetchDebs(dir, goarch string, pkgs []string) error {
	arch, ok := debianArch[goarch]
	if !ok {
		return fmt.Errorf("architecture %q: no Debian name known", goarch)
	}
	native, err := exec.Command("dpkg", "--print-architecture").Output()
	if err != nil {
		return fmt.Errorf("dpkg --print-architecture: %w", err)
	}
	args := []string{"download", "-q"}
	for _, p := range pkgs {
		if arch != strings.TrimSpace(string(native)) {
			p += ":" + arch
		}
		args = append(args, p)
	}
	download := func() ([]byte, error) {
		cmd := exec.Command("apt-get", args...)
		cmd.Dir = dir
		return cmd.CombinedOutput()
	}
	if _, err := download(); err == nil {
		return nil
	}
	if out, err := exec.Command("apt-get", "update", "-qq").CombinedOutput(); err != nil {
		return fmt.Errorf("apt-get update: %w\n%s", err, out)
	}
	if out, err := download(); err != nil {
		return fmt.Errorf("apt-get %s: %w\n%s", strings.Join(args, " "), err, out)
	}
	return nil
}

// findDeb returns the one .deb of pkg in dir.
func findDeb(dir, pkg string) (string, error) {
	matches, err := filepath.Glob(filepath.Join(dir, pkg+"_*.deb"))
	if err != nil {
		return "", err
	}
	if len(matches) != 1 {
		return "", fmt.Errorf("Debian package %s: want one %s_*.deb in %s, found %d", pkg, pkg, dir, len(matches))
	}
	return matches[0], nil
}

// addDeb adds the files of Debian package pkg (its data archive, as dpkg would unpack it, less
// documentation) to entries.
func addDeb(entries map[string]*entry, dir, pkg string) error {
	deb, err := findDeb(dir, pkg)
	if err != nil {
		return err
	}
	out, err := exec.Command("dpkg-deb", "--fsys-tarfile", deb).Output()
	if err != nil {
		return fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", deb, err)
	}
	files, err := readLayer(bytes.NewReader(out))
	if err != nil {
		return fmt.Errorf("%s: %w", deb, err)
	}
	for _, e := range files {
		name := strings.TrimPrefix(path.Clean(e.hdr.Name), "./")
		if name == "." || skippedDebPath(name) {
			continue
		}
		if e.hdr.Typeflag == tar.TypeDir {
			if _, ok := entries[name]; ok {
				continue // directories are shared between packages
			}
		}
		if e.hdr.Typeflag == tar.TypeLink {
			e.hdr.Linkname = strings.TrimPrefix(path.Clean(e.hdr.Linkname), "./")
		}
		if old, ok := entries[name]; ok && old.hdr.Typeflag != tar.TypeDir {
			return fmt.Errorf("%s: %s is also in another package", deb, name)
		}
		e.hdr.PAXRecords = nil
		entries[name] = e
	}
	return nil
}

func skippedDebPath(name string) bool {
	for _, p := range debSkipped {
		if strings.HasPrefix(name+"/", p) {
			return true
		}
	}
	return false
}

// DebVersions returns "package=version" of every package of img found in dir, for the image's
// labels.
func DebVersions(dir string, pkgs []string) ([]string, error) {
	var out []string
	for _, pkg := range pkgs {
		deb, err := findDeb(dir, pkg)
		if err != nil {
			return nil, err
		}
		v, err := exec.Command("dpkg-deb", "--field", deb, "Version").Output()
		if err != nil {
			return nil, fmt.Errorf("dpkg-deb --field %s Version: %w", deb, err)
		}
		out = append(out, pkg+"="+strings.TrimSpace(string(v)))
	}
	return out, nil
}

// tempDir is os.MkdirTemp with the error named.
func tempDir(pattern string) (string, error) {
	d, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", fmt.Errorf("temporary directory: %w", err)
	}
	return d, nil
}
