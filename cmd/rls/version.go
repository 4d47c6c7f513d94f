package main

import "runtime/debug"

// buildVersion is set at link time: -ldflags "-X main.buildVersion=v1.2.3".
var buildVersion string

// version returns the link-time version, else the module version or VCS
// revision recorded by the go command.
func version() string {
	if buildVersion != "" {
		return buildVersion
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" {
			return "devel-" + s.Value[:min(12, len(s.Value))]
		}
	}
	return "devel"
}
