// Package buildinfo reports what a binary was built from, for the `version` subcommands. The
// release version is stamped at link time:
//
//	go build -ldflags "-X github.com/kubemesh/proxy-init/internal/buildinfo.Version=v1.2.3"
//
// The rest comes from runtime/debug.ReadBuildInfo; VCS fields built without VCS stay empty.
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
	// Module and ModuleVersion are the main module's ("(devel)" for a build from a checkout).
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

// String renders it on one line: "v1.2.3 (revision 4fa3da8, 2026-11-29T10:00:00Z; go1.26.8 ...)".
func (i Info) String() string {
	var details []string
	if i.Revision != "" {
		rev := i.Revision[:min(12, len(i.Revision))]
		if i.Modified {
			rev += "-dirty"
		}
		details = append(details, "revision "+rev)
	}
	if i.Time != "" {
		details = append(details, i.Time)
	}
	if len(details) == 0 {
		return fmt.Sprintf("%s (%s %s)", i.Version, i.GoVersion, i.Platform)
	}
	return fmt.Sprintf("%s (%s; %s %s)", i.Version, strings.Join(details, ", "), i.GoVersion, i.Platform)
}
