package descriptors

import (
	"encoding/binary"

	"github.com/sluice-rls/sluice/bucket"
)

// KeyKind says which layer a bucket belongs to. The numbers are part of
// the key encoding: never renumber.
type KeyKind uint8

const (
	// GlobalBucket is the cluster-wide bucket (Redis, or the fallback).
	GlobalBucket KeyKind = 1
	// LocalBucket is the per-node bucket of ordinary traffic.
	LocalBucket KeyKind = 2
	// GrayLocalBucket is the per-node bucket of gray traffic.
	GrayLocalBucket KeyKind = 3
)

// keyVersion is the first byte of every encoding; bump it to give every
// bucket a fresh key when the encoding changes.
const keyVersion = 1

// BucketKey derives the key of the bucket that a request descriptor
// (entries, gray entries removed) uses under rule, in the given layer, with
// the given shape. rule may be nil: an Envoy `limit` override on a
// descriptor that matched no rule, keyed by the entries themselves.
//
// The key is the first 16 bytes of SHA-256 over a canonical encoding:
//
//	version, kind, len+domain,
//	rule == nil: 0, count, then len+key len+value per entry;
//	rule != nil: 1, level count, then per level len+key, value kind,
//	             len+value (the exact value or pattern; empty when key-only),
//	             then entry count and per entry len+key and either 0, len+value,
//	             or 1 alone when its level has share_threshold (so every
//	             matching value shares one bucket);
//	then limit.Requests, limit.Period (ns), limit.Burst as 8-byte big-endian.
//
// Lengths are uvarints, so the encoding is prefix-free: distinct inputs
// never encode alike, whatever bytes ('_', ':', '.', '{', '}', …) keys and
// values contain. It holds nothing that depends on memory or load order,
// so an unchanged rule keeps its keys across reloads; a changed limit
// gets a fresh bucket.
//
// buf is scratch space, returned (grown) for reuse; with a reused buf,
// BucketKey does not allocate.
func BucketKey(buf []byte, domain string, rule *Rule, kind KeyKind, entries []Entry, limit bucket.Limit) (bucket.Key, []byte) {
	b := AppendKeyMaterial(buf[:0], domain, rule, kind, entries, limit)
	return bucket.SumKey(b), b
}

// AppendKeyMaterial appends to buf the canonical encoding BucketKey hashes.
// Callers that hash it another way (bucket.NodeHasher) use it directly.
func AppendKeyMaterial(buf []byte, domain string, rule *Rule, kind KeyKind, entries []Entry, limit bucket.Limit) []byte {
	b := append(buf, keyVersion, byte(kind))
	b = appendString(b, domain)
	if rule == nil {
		b = append(b, 0)
		b = binary.AppendUvarint(b, uint64(len(entries)))
		for i := range entries {
			b = appendString(b, entries[i].Key)
			b = appendString(b, entries[i].Value)
		}
	} else {
		b = append(b, 1)
		b = binary.AppendUvarint(b, uint64(len(rule.levels)))
		for i := range rule.levels {
			l := &rule.levels[i]
			b = appendString(b, l.key)
			b = append(b, byte(l.kind))
			b = appendString(b, l.value)
		}
		b = binary.AppendUvarint(b, uint64(len(entries)))
		for i := range entries {
			b = appendString(b, entries[i].Key)
			if i < len(rule.levels) && rule.levels[i].share {
				b = append(b, 1)
				continue
			}
			b = append(b, 0)
			b = appendString(b, entries[i].Value)
		}
	}
	b = binary.BigEndian.AppendUint64(b, limit.Requests)
	b = binary.BigEndian.AppendUint64(b, uint64(limit.Period))
	return binary.BigEndian.AppendUint64(b, limit.Burst)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}
