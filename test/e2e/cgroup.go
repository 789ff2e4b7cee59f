package e2e

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// cgroupMounts lists the mount points of the machine's cgroup hierarchies, v1 and v2.
func cgroupMounts() ([]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var mps []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// mountinfo: ID parent major:minor root mountpoint options [optional...] - fstype source super
		fields := strings.Fields(sc.Text())
		sep := slices.Index(fields, "-")
		if sep < 0 || sep+1 >= len(fields) || len(fields) < 5 {
			continue
		}
		if fstype := fields[sep+1]; fstype == "cgroup" || fstype == "cgroup2" {
			mps = append(mps, fields[4])
		}
	}
	return mps, sc.Err()
}

// makeCgroup creates a cgroup in every hierarchy, its parent already there: the kubelet refuses
// a root that does not exist. A new cpuset cgroup starts with no CPUs and no memory nodes, so it
// gets its parent's.
func makeCgroup(path string) error {
	mps, err := cgroupMounts()
	if err != nil {
		return err
	}
	for _, mp := range mps {
		dir := filepath.Join(mp, path)
		if err := os.Mkdir(dir, 0o755); err != nil {
			return fmt.Errorf("create cgroup %s: %w", dir, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			val, err := os.ReadFile(filepath.Join(filepath.Dir(dir), f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(dir, f), val, 0o644); err != nil {
				return fmt.Errorf("cgroup %s: %w", dir, err)
			}
		}
	}
	return nil
}

// removeCgroups removes a cgroup and everything the kubelets and runc made under it, deepest
// first, retrying while the kernel still counts a process that has just died.
func removeCgroups(path string) error {
	mps, err := cgroupMounts()
	if err != nil {
		return err
	}
	var errs []error
	for _, mp := range mps {
		root := filepath.Join(mp, path)
		var dirs []string
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			var rmErr error
			for range 50 {
				if rmErr = os.Remove(dirs[i]); rmErr == nil || errors.Is(rmErr, fs.ErrNotExist) {
					rmErr = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if rmErr != nil {
				errs = append(errs, fmt.Errorf("remove cgroup: %w", rmErr))
			}
		}
	}
	return errors.Join(errs...)
}
