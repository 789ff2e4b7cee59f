// Command manifests writes deploy/linkerd-cni, the default rendering of the linkerd2-cni chart
// (test/helmchart), replacing the files that were there. Run from the repository root
// (`make manifests`).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kubemesh/proxy-init/test/helmchart"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "manifests: "+err.Error())
		os.Exit(1)
	}
}

func run() error {
	ch, err := helmchart.Load(".")
	if err != nil {
		return err
	}
	files, err := helmchart.Manifests(ch)
	if err != nil {
		return err
	}
	// Glob fails only on a bad pattern.
	old, _ := filepath.Glob(filepath.Join(helmchart.ManifestsDir, "*.yaml"))
	optional, _ := filepath.Glob(filepath.Join(helmchart.ManifestsDir, "optional", "*.yaml"))
	for _, f := range append(old, optional...) {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	for _, name := range helmchart.Names(files) {
		p := filepath.Join(helmchart.ManifestsDir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(files[name]), 0o644); err != nil {
			return err
		}
		fmt.Println(p)
	}
	return nil
}
