package flags

import (
	"flag"
	"fmt"
	"time"

	"github.com/sluice-rls/sluice/override"
)

// Overrides are the flags of runtime overrides and of the admin
// endpoint that changes them (docs/operating-limits.md).
type Overrides struct {
	// AdminTokenFile holds the bearer tokens of /overrides on the admin
	// listener, one "name:token" a line; re-read when it changes.
	AdminTokenFile string
	// File persists this node's overrides without Redis; empty: memory
	// only, lost at restart.
	File string
	// Resync is the longest time between two reads of the override store.
	Resync time.Duration
	// MaxExpiry is the furthest expiry of a loosening override (allow,
	// shadow, scale above 1, a higher limit), which must have one.
	MaxExpiry time.Duration
}

func (o *Overrides) register(fs *flag.FlagSet) {
	fs.StringVar(&o.AdminTokenFile, "admin-token-file", "", "file of bearer tokens for /overrides on the admin address, one name:token a line (the name is the author of what the token changes); re-read on change. /overrides is served when this or --tls-client-ca is set")
	fs.StringVar(&o.File, "override-file", "", "without --redis: file this node keeps its runtime overrides in, so they survive restarts (default: memory only)")
	fs.DurationVar(&o.MaxExpiry, "override-max-expiry", override.DefaultMaxLoosenExpiry, "furthest expiry of an override that loosens the limits (allow, shadow, scale above 1, a higher limit); such overrides must have one, and a set beyond it is refused")
	fs.DurationVar(&o.Resync, "override-resync", override.DefaultResync, "longest time between two reads of the runtime overrides (Redis hash or file), besides change notifications; bounds their propagation when a notification is lost")
}

func (o Overrides) validate(redis string) error {
	if o.Resync <= 0 || o.Resync > time.Second {
		return fmt.Errorf("--override-resync must be in (0, 1s] (overrides reach every node within 1 s), not %v", o.Resync)
	}
	if o.MaxExpiry <= 0 {
		return fmt.Errorf("--override-max-expiry must be positive, not %v", o.MaxExpiry)
	}
	if o.File != "" && redis != "" {
		return fmt.Errorf("--override-file is for nodes without --redis: with Redis, overrides live in Redis")
	}
	return nil
}
