package share_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/bucket"
)

// ReadShares reads a share hit's share and two parts apart and takes nothing: the
// cell's tokens are not added to Redis' part. A node that holds no share
// reads no cell, and a take is refused.
func TestReadSharesParts(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 0)
	f.hit(t, takeOf("a", 4))  // from a's cell: 6 of 10 left
	f.hit(t, takeOf("a", 10)) // does not fit the cell: Redis' part, 20 of 30 left
	plain := bucket.Hit{Key: key("p"), Limit: perMinute}
	read := func() ([]bucket.Hit, []bucket.State, []bucket.Limit, []bucket.State, int) {
		t.Helper()
		hits := []bucket.Hit{takeOf("a", 0), plain}
		hits[0].Independent, hits[1].Independent = true, true
		states, shares, cells, cellStates := make([]bucket.State, 2), make([]uint32, 2), make([]bucket.Limit, 2), make([]bucket.State, 2)
		n, d, err := f.l.ReadShares(context.Background(), hits, states, shares, cells, cellStates)
		if err != nil || !d.Allowed {
			t.Fatalf("ReadShares: %+v, %v", d, err)
		}
		if shares[0] != half || shares[1] != 0 {
			t.Fatalf("ReadShares: shares %v, want [%d 0]", shares, half)
		}
		return hits, states, cells, cellStates, n
	}
	cell := bucket.Limit{Requests: 60, Period: 6 * time.Minute, Burst: 10}
	for range 2 { // the second read finds what the first did: it took nothing
		hits, states, cells, cellStates, n := read()
		if n != 3 || hits[0].Limit != redisPart || states[0].Remaining != 20 || cells[0] != cell || cellStates[0].Remaining != 6 {
			t.Fatalf("share hit: n %d, limit %+v, %d left, cell %+v with %d left; want 3, %+v, 20, %+v, 6",
				n, hits[0].Limit, states[0].Remaining, cells[0], cellStates[0].Remaining, redisPart, cell)
		}
		if hits[1].Limit != perMinute || states[1].Remaining != 60 || cells[1] != (bucket.Limit{}) {
			t.Fatalf("plain hit: limit %+v, %d left, cell %+v; want its own limit, 60, no cell", hits[1].Limit, states[1].Remaining, cells[1])
		}
	}
	f.member.set(3, false)
	if _, states, cells, _, n := read(); n != 0 || cells[0] != (bucket.Limit{}) || states[0].Remaining != 20 {
		t.Errorf("not holding shares: n %d, cell %+v, Redis' part %d left; want 0, none, 20", n, cells[0], states[0].Remaining)
	}
	take := []bucket.Hit{takeOf("a", 1)}
	if _, _, err := f.l.ReadShares(context.Background(), take, make([]bucket.State, 1), make([]uint32, 1), make([]bucket.Limit, 1), make([]bucket.State, 1)); err == nil {
		t.Errorf("ReadShares of a take: no error")
	}
}
