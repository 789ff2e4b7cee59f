// Package buildinfo reports what a binary was built from, for the `version` subcommands of
// proxy-init and linkerd-cni.
//
// The release version cannot be known by the Go toolchain, so it is stamped at link time:
//
//	go build -ldflags "-X github.com/kubemesh/proxy-init/internal/buildinfo.Version=v1.2.3"
//
// Everything else comes from runtime/debug.ReadBuildInfo. VCS fields are empty when the binary
// was built with -buildvcs=false or outside a git checkout; that is reported, not guessed.
package buildinfo

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"
)

// Version is the release version, set with -ldflags -X. "dev" marks an unstamped build.
var Version = "dev"

// Info describes one binary.
type Info struct {
	Version   string `json:"version"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
	// Module and ModuleVersion are the main module's path and version as the toolchain recorded
	// them ("(devel)" for a build from a checkout).
	Module        string `json:"module,omitempty"`
	ModuleVersion string `json:"moduleVersion,omitempty"`
	Revision      string `json:"revision,omitempty"`
	Time          string `json:"time,omitempty"`
	Modified      bool   `json:"modified,omitempty"`
}

// Get returns the build information of the running binary.
func Get() Info {
	info := Info{Version: Version, GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	info.Module, info.ModuleVersion = bi.Main.Path, bi.Main.Version
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String renders the information on one line, e.g.
// "v1.2.3 (revision 4fa3da8, 2026-11-29T10:00:00Z; go1.26.8 linux/amd64)".
func (i Info) String() string {
	var details []string
	if i.Revision != "" {
		rev := i.Revision
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if i.Modified {
			rev += "-dirty"
		}
		details = append(details, "revision "+rev)
	}
	if i.Time != "" {
		details = append(details, i.Time)
	}
	details = append(details, i.GoVersion+" "+i.Platform)
	if len(details) == 1 {
		return fmt.Sprintf("%s (%s)", i.Version, details[0])
	}
	last := len(details) - 1
	return fmt.Sprintf("%s (%s; %s)", i.Version, strings.Join(details[:last], ", "), details[last])
}
