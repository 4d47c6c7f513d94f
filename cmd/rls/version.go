package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"

	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/node"
)

// versionCmd prints the build of the running binary: one line, or with
// --json one object {"version", "commit", "go_version"}.
func versionCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print a JSON object: version, commit, go_version")
	if err := flags.ParseInterspersed(fs, args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return errUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "rls version: no arguments expected, got %q\n", fs.Args())
		return errUsage
	}
	b := currentBuild()
	if !*asJSON {
		fmt.Fprintln(stdout, b)
		return nil
	}
	out, err := json.Marshal(struct {
		Version   string `json:"version"`
		Commit    string `json:"commit"`
		GoVersion string `json:"go_version"`
	}{b.Version, b.Commit, b.GoVersion})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s\n", out)
	return nil
}

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
