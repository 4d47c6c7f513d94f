// Package xds takes sluice's rules from an xDS management server: it
// subscribes to ratelimit.config.ratelimit.v3.RateLimitConfig resources
// (State of the World, over the Aggregated Discovery Service, as
// envoyproxy/ratelimit's CONFIG_TYPE=GRPC_XDS_SOTW and Envoy Gateway do)
// and swaps each update into a ruleset.Store, atomically, like a file
// reload.
//
// Every update goes through the same validation as a rule file: each
// resource becomes the descriptors.File it stands for and the set is
// validated by descriptors.New. When that refuses the update or warns,
// each resource is rendered as the rule file it stands for and read by
// descriptors.Parse, so a bad update gets the same reasons, with the
// positions a rule file's have, is refused with a NACK carrying them, and
// never replaces the running rules.
//
// Before any of that, an update is held to Limits (resources, bytes,
// nesting, descriptors), so that a hostile one costs little more than
// reading it; NACKs in a row and reconnects back off (see Source.Run).
//
// Each applied update is recorded as a reload (audit.Recorder); an update
// that leaves the rules as they are is ACKed and changes nothing.
package xds
