package flags

import (
	"flag"
)

// registerAdaptive registers --adaptive-config onto path.
func registerAdaptive(fs *flag.FlagSet, path *string) {
	fs.StringVar(path, "adaptive-config", "", "file of adaptive limits: policies that scale rules with the backend's health, read from Prometheus (docs/adaptive.md); with --redis one node acts for the fleet (default: off)")
}
