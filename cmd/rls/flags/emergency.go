package flags

import (
	"errors"
	"flag"
	"fmt"
)

// Emergency are the flags of the emergency channel (docs/operations.md,
// "The emergency channel"). Both empty, the default: the channel is off.
type Emergency struct {
	// Key is the descriptor key Envoy sets from the emergency header.
	Key string
	// SecretFile holds the hex SHA-256 digests of the accepted secrets.
	SecretFile string
}

func (e *Emergency) register(fs *flag.FlagSet) {
	fs.StringVar(&e.Key, "emergency-key", "", "descriptor key of the emergency channel: a request whose entry of this key holds an accepted secret is allowed whatever the limits, counted and logged; entries of this key are never matched (empty: channel off)")
	fs.StringVar(&e.SecretFile, "emergency-secret-file", "", "file of the hex SHA-256 digests of the accepted emergency secrets, one per line, # comments; re-read when it changes")
}

func (e Emergency) validate(grayKey string) error {
	switch {
	case e.Key == "" && e.SecretFile == "":
		return nil
	case e.Key == "":
		return errors.New("--emergency-secret-file needs --emergency-key")
	case e.SecretFile == "":
		return errors.New("--emergency-key needs --emergency-secret-file")
	case e.Key == grayKey:
		return fmt.Errorf("--emergency-key and --gray-key are both %q", e.Key)
	}
	return nil
}
