package service

import "github.com/sluice-rls/sluice/descriptors"

// ShareDigest returns the digest of the standing shares the rules of cfg
// hold on a server with s (descriptors.Config.ShareDigest with the default
// Share): 0 under QuotaMode, where every hit is a charge and no rule holds
// one. Nodes that publish the same digest split every limit alike.
func (s Settings) ShareDigest(cfg *descriptors.Config) uint64 {
	if s.QuotaMode {
		return 0
	}
	return cfg.ShareDigest(descriptors.Millionths(s.Share))
}
