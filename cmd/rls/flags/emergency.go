package flags

import (
	"flag"

	"github.com/sluice-rls/sluice/node"
)

// registerEmergency registers the flags of Emergency onto e.
func registerEmergency(fs *flag.FlagSet, e *node.Emergency) {
	fs.StringVar(&e.Key, "emergency-key", "", "descriptor key of the emergency channel: a request whose entry of this key holds an accepted secret is allowed whatever the limits, counted and logged; entries of this key are never matched (empty: channel off)")
	fs.StringVar(&e.SecretFile, "emergency-secret-file", "", "file of the hex SHA-256 digests of the accepted emergency secrets, one per line, # comments; re-read when it changes")
}
