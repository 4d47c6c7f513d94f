package flags

import (
	"flag"

	"github.com/sluice-rls/sluice/node"
	"github.com/sluice-rls/sluice/override"
)

// registerOverrides registers the flags of Overrides onto o.
func registerOverrides(fs *flag.FlagSet, o *node.Overrides) {
	fs.StringVar(&o.AdminTokenFile, "admin-token-file", "", "file of bearer tokens for /overrides on the admin address, one name:token a line (the name is the author of what the token changes); re-read on change. /overrides is served when this or --tls-client-ca is set")
	fs.StringVar(&o.File, "override-file", "", "without --redis: file this node keeps its runtime overrides in, so they survive restarts (default: memory only)")
	DurationVar(fs, &o.MaxExpiry, "override-max-expiry", override.DefaultMaxLoosenExpiry, "furthest expiry, a `duration` ahead (2h, 1d), of an override that loosens the limits (allow, shadow, scale above 1, a higher limit); such overrides must have one, and a set beyond it is refused")
	fs.DurationVar(&o.Resync, "override-resync", override.DefaultResync, "longest time between two reads of the runtime overrides (Redis hash or file), besides change notifications; bounds their propagation when a notification is lost")
}
