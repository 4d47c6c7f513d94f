package service_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
)

// TestReloadIsAtomicUnderLoad swaps between two rule sets while requests
// run; every response must come wholly from one set, never a mix.
func TestReloadIsAtomicUnderLoad(t *testing.T) {
	rulesA := `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1000000}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 1000000}
`
	rulesB := `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 2000000}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 2000000}
`
	cfgA, cfgB := mustRules(t, rulesA), mustRules(t, rulesB)
	store := ruleset.NewStore(cfgA)
	h := newHarness(t, rulesA, func(o *service.Options) { o.Rules = store })

	var stop atomic.Bool
	swapped := make(chan int)
	go func() {
		n := 0
		for ; !stop.Load(); n++ {
			if n%2 == 0 {
				store.Swap(cfgB)
			} else {
				store.Swap(cfgA)
			}
		}
		swapped <- n
	}()
	var wg sync.WaitGroup
	var mixed, seenA, seenB atomic.Int64
	for range 4 {
		wg.Go(func() {
			req := request("d", desc("a=1"), desc("b=1"))
			for range 2000 {
				resp, err := h.srv.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Error(err)
					return
				}
				a := resp.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit()
				b := resp.GetStatuses()[1].GetCurrentLimit().GetRequestsPerUnit()
				switch {
				case a != b:
					mixed.Add(1)
				case a == 1000000:
					seenA.Add(1)
				default:
					seenB.Add(1)
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	if n := <-swapped; n < 2 {
		t.Fatalf("only %d swaps happened during the load", n)
	}
	if mixed.Load() != 0 {
		t.Errorf("%d responses mixed the two rule sets", mixed.Load())
	}
	if seenA.Load() == 0 || seenB.Load() == 0 {
		t.Errorf("responses saw set A %d times and set B %d times; want both", seenA.Load(), seenB.Load())
	}
}

// TestReloadKeepsBucketsOfUnchangedRules: a reload builds new rule objects,
// but a rule keeps its buckets (its keys are derived from what the rule
// says, not from the object); a rule whose numbers changed keeps them too,
// converted: what was spent stays spent (TestReloadKeepsConsumption).
func TestReloadKeepsBucketsOfUnchangedRules(t *testing.T) {
	before := `
domain: d
descriptors:
  - key: same
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: changed
    rate_limit: {unit: minute, requests_per_unit: 5}
`
	after := `
domain: d
descriptors:
  - key: same
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: changed
    rate_limit: {unit: minute, requests_per_unit: 6}
`
	store := ruleset.NewStore(mustRules(t, before))
	h := newHarness(t, before, func(o *service.Options) { o.Rules = store })
	h.admitted(t, 5, request("d", desc("same=x")))
	h.admitted(t, 5, request("d", desc("changed=x")))
	store.Swap(mustRules(t, after))
	if got := h.admitted(t, 3, request("d", desc("same=x"))); got != 0 {
		t.Errorf("unchanged rule admitted %d after the reload, want 0 (its bucket is still empty)", got)
	}
	if got := h.admitted(t, 10, request("d", desc("changed=x"))); got != 1 {
		t.Errorf("changed rule admitted %d after the reload, want 1 (5 of 6 spent)", got)
	}
}
