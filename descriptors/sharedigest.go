package descriptors

import (
	"crypto/sha256"
	"encoding/binary"
)

// ShareDigest returns a digest of the standing shares c's rules hold with
// def the server's default share (ShareMillionths): the first 64 bits of
// SHA-256 over each rule holding one, in Rules' order, by domain, path
// and share. Two rule sets have the same digest when their rules hold
// the same shares, and, but for a hash collision, only then; rules
// without a share, and every other setting, leave it unchanged. It is 0
// when no rule holds a share.
//
// Nodes compare it before holding shares (backend/redis Nodes): a rule
// whose share differs between two nodes has its limit split two ways.
func (c *Config) ShareDigest(def uint32) uint64 {
	h := sha256.New()
	var buf []byte
	for _, r := range c.Rules() {
		f := r.ShareMillionths(def)
		if f == 0 {
			continue
		}
		// Lengths first, so that no two lists of rules write the same bytes.
		buf = binary.AppendUvarint(buf[:0], uint64(len(r.Domain)))
		buf = append(buf, r.Domain...)
		buf = binary.AppendUvarint(buf, uint64(len(r.Path)))
		buf = append(buf, r.Path...)
		buf = binary.BigEndian.AppendUint32(buf, f)
		h.Write(buf)
	}
	if buf == nil {
		return 0
	}
	return binary.BigEndian.Uint64(h.Sum(nil))
}
