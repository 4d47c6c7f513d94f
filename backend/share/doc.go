// Package share is sluice's standing-shares layer: a bucket.Limiter in
// front of the global layer that decides, with no call to the layer
// behind, the hits of rules with a share f (Rule, read from bucket.Hit's
// Rule; Options.Default for the rules that set none) that fit this node's
// share of their key.
//
// A rule with share f splits each key's limit in two parts that add up to
// at most the limit: every live node holds a share cell of f/n of it
// (burst ⌊f × burst / n⌋, rate f × rate / n), n being the node count of
// the registry (Membership), and the layer behind, Redis, holds the rest,
// (1 − f) of the burst and of the rate, in the key's own bucket. A take
// that fits its cell is decided here; the takes that do not go to the
// layer behind at Redis' part, in one call with every hit that has no
// share, and when that call refuses, the tokens the cells gave are given
// back: all-or-nothing across descriptors and layers, as bucket.Hit
// documents.
//
// The cells are a backend/memory table. Whenever this node's share
// changes (it is admitted, or n changes) every cell starts empty, keeping
// a debt, and refills at the new rate: a share gains tokens only by
// refill, so the shares together never admit more than f × (burst + rate
// × T) over a window T, whatever joins and leaves. A limit change
// converts a cell keeping what was spent. Only full cells are evicted,
// and a key that finds the table full goes to Redis' part, never to a
// fresh cell. While Membership says this node is not admitted it takes
// nothing from its cells and sends every hit to Redis' part, never to the
// whole limit, which other nodes' shares would then exceed.
//
// docs/decisions/0021-standing-shares.md gives the bound (shares plus
// Redis' part never admit more than burst + rate × T) and what joins,
// departures, Redis failures and skew do to it.
package share
