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
// bucket a fresh key when the encoding changes. Version 2 left a rule's
// numbers out of its buckets' identity (version 1 ended every encoding with
// them).
const keyVersion = 2

// BucketKey derives the key of the bucket that a request descriptor
// (entries, gray entries removed) uses under rule, in the given layer. rule
// may be nil: an Envoy `limit` override on a descriptor that matched no
// rule, keyed by the entries themselves.
//
// A bucket's identity is its rule and values, not its numbers: a rule
// whose requests, unit or burst change keeps its buckets, and the backends
// convert what each has spent to the new limit (bucket.Limit). Only an
// Envoy limit override (override non-nil) puts its numbers into the key,
// so that each distinct override has a bucket of its own: two routes that
// override one descriptor with different limits would otherwise share a
// bucket and convert it back and forth on every request, the smaller
// limit's route refused while the larger's spent beyond its burst.
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
//	then 0, or 1 and the override's Requests, Period (ns), Burst as
//	8-byte big-endian.
//
// Lengths are uvarints, so the encoding is prefix-free: distinct inputs
// never encode alike, whatever bytes ('_', ':', '.', '{', '}', …) keys and
// values contain. It holds nothing that depends on memory or load order,
// so a rule keeps its keys across reloads, also when its limit changes.
//
// buf is scratch space, returned (grown) for reuse; with a reused buf,
// BucketKey does not allocate.
func BucketKey(buf []byte, domain string, rule *Rule, kind KeyKind, entries []Entry, override *bucket.Limit) (bucket.Key, []byte) {
	b := AppendKeyMaterial(buf[:0], domain, rule, kind, entries, override)
	return bucket.SumKey(b), b
}

// AppendKeyMaterial appends to buf the canonical encoding BucketKey hashes.
// Callers that hash it another way (bucket.NodeHasher) use it directly.
func AppendKeyMaterial(buf []byte, domain string, rule *Rule, kind KeyKind, entries []Entry, override *bucket.Limit) []byte {
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
	if override == nil {
		return append(b, 0)
	}
	b = append(b, 1)
	b = binary.BigEndian.AppendUint64(b, override.Requests)
	b = binary.BigEndian.AppendUint64(b, uint64(override.Period))
	return binary.BigEndian.AppendUint64(b, override.Burst)
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}
