package main

import (
	"runtime"
	"runtime/debug"

	"github.com/sluice-rls/sluice/node"
)

// Set at link time by `make build` and the Dockerfile:
//
//	-ldflags "-X main.buildVersion=v1.2.3 -X main.buildCommit=0123abc"
var (
	buildVersion string
	buildCommit  string
)

// currentBuild returns the link-time version and commit; without them, the
// module version or VCS revision the go command recorded.
func currentBuild() node.Build {
	info, _ := debug.ReadBuildInfo()
	return node.Build{
		Version:   versionOf(info),
		Commit:    commitOf(info),
		GoVersion: runtime.Version(),
	}
}

// version returns the version of the running binary (currentBuild).
func version() string { return currentBuild().Version }

// versionOf returns the link-time version, else the module version or VCS
// revision in info (nil: none recorded), else "devel".
func versionOf(info *debug.BuildInfo) string {
	if buildVersion != "" {
		return buildVersion
	}
	if info == nil {
		return "devel"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	if rev := vcsRevision(info); rev != "" {
		return "devel-" + rev[:min(12, len(rev))]
	}
	return "devel"
}

// commitOf returns the link-time commit, else the VCS revision in info,
// else "unknown".
func commitOf(info *debug.BuildInfo) string {
	if buildCommit != "" {
		return buildCommit
	}
	if rev := vcsRevision(info); rev != "" {
		return rev
	}
	return "unknown"
}

func vcsRevision(info *debug.BuildInfo) string {
	if info == nil {
		return ""
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			return s.Value
		}
	}
	return ""
}
