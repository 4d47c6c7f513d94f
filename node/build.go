package node

// Build is the build of the running binary: what `rls version` prints
// and ratelimit_build_info exports.
type Build struct {
	Version   string // the release tag, e.g. v1.2.3
	Commit    string // the VCS revision the binary was built from
	GoVersion string // the Go toolchain, e.g. go1.26.8
}

// String is the line `rls version` prints.
func (b Build) String() string {
	return "rls " + b.Version + " (commit " + b.Commit + ", " + b.GoVersion + ")"
}
