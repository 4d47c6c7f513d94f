package xds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/internal/xdstest"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/xds"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const node = "sluice-test"

// limit is a RateLimitConfig of domain with one rule key=value at rpu per
// minute.
func limit(domain, key, value string, rpu uint32) *rlsconfv3.RateLimitConfig {
	return &rlsconfv3.RateLimitConfig{
		Name:   domain,
		Domain: domain,
		Descriptors: []*rlsconfv3.RateLimitDescriptor{{
			Key: key, Value: value,
			RateLimit: &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: rpu},
		}},
	}
}

// requestsOf is the requests per period of the rule matching key=value in
// domain, or -1 when none matches.
func requestsOf(cfg *descriptors.Config, domain, key, value string) int64 {
	r := cfg.Domain(domain).Match([]descriptors.Entry{{Key: key, Value: value}})
	if r == nil || r.Global == nil {
		return -1
	}
	return int64(r.Global.Requests)
}

type harness struct {
	src     *xds.Source
	store   *ruleset.Store
	reg     *prometheus.Registry
	clock   *clockwork.FakeClock
	cancel  context.CancelFunc
	stopped chan struct{}
}

func startSource(t *testing.T, addr string) *harness {
	t.Helper()
	empty, err := descriptors.New(nil, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{store: ruleset.NewStore(empty), reg: prometheus.NewRegistry(), clock: clockwork.NewFakeClock(), stopped: make(chan struct{})}
	h.src, err = xds.New(xds.Options{
		Server: addr,
		NodeID: node,
		// No DialOptions: plaintext.
		Store:      h.store,
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		Reloads:    ruleset.NewReloadMetrics(h.reg),
		Metrics:    xds.NewMetrics(h.reg),
		Clock:      h.clock,
		BackoffMin: time.Second,
		BackoffMax: 4 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	go func() {
		defer close(h.stopped)
		if err := h.src.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(h.stop)
	return h
}

func (h *harness) stop() {
	h.cancel()
	<-h.stopped
}

func (h *harness) version(t *testing.T) string {
	t.Helper()
	v, ok := h.src.Version()
	if !ok {
		t.Fatal("no version: no update applied")
	}
	return v
}

func waitReady(t *testing.T, src *xds.Source) {
	t.Helper()
	select {
	case <-src.Ready():
	case <-time.After(xdstest.Wait):
		t.Fatal("no update applied")
	}
}

// TestUpdatesNACKAndReconnect walks a source through the life of a
// deployment against a real management server: the first config, an
// update, a bad update (NACKed with its reasons, the old rules kept), and
// the server going away and coming back on the same port with a new
// version.
func TestUpdatesNACKAndReconnect(t *testing.T) {
	mgmt := xdstest.Start(t, "")
	mgmt.Set(t, node, "v1", limit("edge", "user", "alice", 10))
	h := startSource(t, mgmt.Addr)

	if _, ok := h.src.Version(); ok {
		t.Error("a version before any update")
	}
	waitReady(t, h.src)
	mgmt.WaitRequest(t, xdstest.ACK("v1"))
	if got := h.version(t); got != "v1" {
		t.Errorf("version %q, want v1", got)
	}
	if got := requestsOf(h.store.Rules(), "edge", "user", "alice"); got != 10 {
		t.Errorf("after v1: edge user=alice allows %d/min, want 10", got)
	}

	// An update: the new limit replaces the old one.
	mgmt.Set(t, node, "v2", limit("edge", "user", "alice", 20), limit("api", "path", "/x", 5))
	mgmt.WaitRequest(t, xdstest.ACK("v2"))
	if got := h.version(t); got != "v2" {
		t.Errorf("version %q, want v2", got)
	}
	if got := requestsOf(h.store.Rules(), "edge", "user", "alice"); got != 20 {
		t.Errorf("after v2: edge user=alice allows %d/min, want 20", got)
	}
	if got := requestsOf(h.store.Rules(), "api", "path", "/x"); got != 5 {
		t.Errorf("after v2: api path=/x allows %d/min, want 5", got)
	}

	// A bad update: a rule without a unit, and a resource with the same
	// descriptor twice. NACKed with every reason; v2 keeps deciding.
	bad := limit("edge", "user", "alice", 1)
	bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	dup := limit("api", "path", "/x", 1)
	dup.Name = "api-again"
	dup.Descriptors = append(dup.Descriptors, dup.Descriptors[0])
	errorsBefore := gauge(t, h.reg, "ratelimit_config_loads_total", "result", "error")
	mgmt.Set(t, node, "v3", bad, dup)
	nack := mgmt.WaitRequest(t, xdstest.NACK)
	msg := nack.GetErrorDetail().GetMessage()
	for _, want := range []string{
		`version "v3"`,
		"xds:edge:",
		"rate_limit has requests_per_unit but no unit",
		"xds:api-again:",
		`duplicate descriptor key "path" value "/x"`,
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("NACK error detail lacks %q:\n%s", want, msg)
		}
	}
	if nack.GetVersionInfo() != "v2" {
		t.Errorf("NACK carries version %q, want the last good one, v2", nack.GetVersionInfo())
	}
	if got := h.version(t); got != "v2" {
		t.Errorf("after the NACK the version is %q, want v2", got)
	}
	if got := requestsOf(h.store.Rules(), "edge", "user", "alice"); got != 20 {
		t.Errorf("after the NACK edge user=alice allows %d/min, want v2's 20", got)
	}
	// The server sends a NACKed update again at once; the source refuses
	// it again and holds that NACK back (on the fake clock): two refusals
	// counted, whenever the test reads them, and no more.
	blockUntilSleeping(t, h.clock)
	if got := gauge(t, h.reg, "ratelimit_config_loads_total", "result", "error") - errorsBefore; got != 2 {
		t.Errorf("ratelimit_config_loads_total{result=error} grew by %v, want 2 (v3 and its resend)", got)
	}

	// The server goes away: the rules stay; it comes back on the same
	// port with a new version, and the source reconnects after its
	// backoff (on the fake clock).
	mgmt.Stop()
	if got := requestsOf(h.store.Rules(), "edge", "user", "alice"); got != 20 {
		t.Errorf("with the server gone edge user=alice allows %d/min, want 20", got)
	}
	mgmt = xdstest.Start(t, mgmt.Addr)
	mgmt.Set(t, node, "v4", limit("edge", "user", "alice", 40))
	deadline := time.Now().Add(xdstest.Wait)
	for v, _ := h.src.Version(); v != "v4"; v, _ = h.src.Version() {
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect: version %q, want v4", v)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		if h.clock.BlockUntilContext(ctx, 1) == nil {
			h.clock.Advance(4 * time.Second) // the backoff's upper bound
		}
		cancel()
	}
	if got := requestsOf(h.store.Rules(), "edge", "user", "alice"); got != 40 {
		t.Errorf("after the reconnect edge user=alice allows %d/min, want 40", got)
	}
	// The reconnect asked for the last version applied, as Envoy does.
	first := mgmt.WaitRequest(t, func(r *discovery.DiscoveryRequest) bool { return r.GetNode() != nil })
	if first.GetVersionInfo() != "v2" || first.GetNode().GetId() != node {
		t.Errorf("first request after the reconnect: version %q node %q, want v2 and %q", first.GetVersionInfo(), first.GetNode().GetId(), node)
	}
	if got := gauge(t, h.reg, "ratelimit_config_info", "source", "xds", "version", "v4"); got != 1 {
		t.Errorf("ratelimit_config_info{source=xds,version=v4} = %v, want 1", got)
	}
}

// blockUntilSleeping waits until the source waits on clock.
func blockUntilSleeping(t *testing.T, clock *clockwork.FakeClock) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), xdstest.Wait)
	defer cancel()
	if err := clock.BlockUntilContext(ctx, 1); err != nil {
		t.Fatalf("the source does not wait: %v", err)
	}
}

// gauge is the value of the sample of metric name with the label pairs kv,
// or -1 when there is none.
func gauge(t *testing.T, reg *prometheus.Registry, name string, kv ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(kv); i += 2 {
				if labels[kv[i]] != kv[i+1] {
					continue metrics
				}
			}
			if c := m.GetCounter(); c != nil {
				return c.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return -1
}

// TestUpdateIsAtomic: while an update changes two domains, a reader of the
// store never sees one changed and the other not.
func TestUpdateIsAtomic(t *testing.T) {
	mgmt := xdstest.Start(t, "")
	mgmt.Set(t, node, "v1", limit("a", "k", "v", 1), limit("b", "k", "v", 1))
	h := startSource(t, mgmt.Addr)
	waitReady(t, h.src)
	mgmt.WaitRequest(t, xdstest.ACK("v1"))

	stop := make(chan struct{})
	result := make(chan string, 1)
	go func() {
		reads, mixed := 0, 0
		for {
			select {
			case <-stop:
				result <- fmt.Sprintf("%d reads, %d mixed", reads, mixed)
				return
			default:
			}
			cfg := h.store.Rules()
			if requestsOf(cfg, "a", "k", "v") != requestsOf(cfg, "b", "k", "v") {
				mixed++
			}
			reads++
		}
	}()
	for i := 2; i <= 20; i++ {
		v := fmt.Sprintf("v%d", i)
		mgmt.Set(t, node, v, limit("a", "k", "v", uint32(i)), limit("b", "k", "v", uint32(i)))
		mgmt.WaitRequest(t, xdstest.ACK(v))
	}
	close(stop)
	if got := <-result; !strings.HasSuffix(got, " 0 mixed") {
		t.Errorf("reader: %s, want none mixed", got)
	}
	if got := requestsOf(h.store.Rules(), "b", "k", "v"); got != 20 {
		t.Errorf("after v20 b allows %d/min, want 20", got)
	}
}

// TestEmptyUpdate: an update without resources is a rule set without rules,
// as in State of the World: every request is allowed.
func TestEmptyUpdate(t *testing.T) {
	mgmt := xdstest.Start(t, "")
	mgmt.Set(t, node, "v1", limit("edge", "user", "alice", 10))
	h := startSource(t, mgmt.Addr)
	mgmt.WaitRequest(t, xdstest.ACK("v1"))
	mgmt.Set(t, node, "v2")
	mgmt.WaitRequest(t, xdstest.ACK("v2"))
	if n := h.store.Rules().Len(); n != 0 || h.version(t) != "v2" {
		t.Errorf("after an empty update: %d rules, version %q; want 0 and v2", n, h.version(t))
	}
}

// lastWait is the wait of the last "reconnecting" log line, and how many
// there are.
func lastWait(t *testing.T, logs string) (time.Duration, int) {
	t.Helper()
	var wait time.Duration
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		var m struct {
			Msg string        `json:"msg"`
			In  time.Duration `json:"in"`
		}
		if json.Unmarshal([]byte(line), &m) == nil && strings.Contains(m.Msg, "reconnecting") {
			wait, n = m.In, n+1
		}
	}
	return wait, n
}

// TestBackoff: the wait before a reconnect doubles from BackoffMin to
// BackoffMax while attempts fail, is jittered to half to all of that, and
// starts again from BackoffMin once a stream stayed open BackoffMax.
func TestBackoff(t *testing.T) {
	mgmt := xdstest.Start(t, "")
	addr := mgmt.Addr
	mgmt.Stop() // nothing listens there now: every attempt fails
	empty, err := descriptors.New(nil, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	var logs logtest.Buffer
	clock := clockwork.NewFakeClock()
	src, err := xds.New(xds.Options{
		Server: addr, NodeID: node, Store: ruleset.NewStore(empty),
		Log:   slog.New(slog.NewJSONHandler(&logs, nil)),
		Clock: clock, BackoffMin: time.Second, BackoffMax: 8 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = src.Run(ctx)
	}()
	defer func() { cancel(); <-stopped }()

	// sleeping waits for the source to sleep and checks the wait of its
	// latest attempt against the backoff d; the caller advances the clock.
	attempts := 0
	sleeping := func(d time.Duration) time.Duration {
		t.Helper()
		bctx, bcancel := context.WithTimeout(context.Background(), xdstest.Wait)
		defer bcancel()
		if err := clock.BlockUntilContext(bctx, 1); err != nil {
			t.Fatalf("the source does not wait: %v", err)
		}
		wait, n := lastWait(t, logs.String())
		if attempts++; n != attempts {
			t.Fatalf("%d reconnect lines, want %d", n, attempts)
		}
		if wait < d/2 || wait > d {
			t.Errorf("attempt %d waits %v, want within [%v, %v]", attempts, wait, d/2, d)
		}
		return wait
	}
	for _, d := range []time.Duration{1, 2, 4, 8} {
		clock.Advance(sleeping(d * time.Second))
	}
	// A server on that port again before the next attempt: it gets an
	// update; when the server goes, the backoff starts over.
	wait := sleeping(8 * time.Second)
	mgmt = xdstest.Start(t, addr)
	mgmt.Set(t, node, "v1", limit("edge", "user", "alice", 10))
	clock.Advance(wait)
	waitReady(t, src)
	mgmt.WaitRequest(t, xdstest.ACK("v1"))
	clock.Advance(8 * time.Second) // the stream stays open BackoffMax: healthy
	mgmt.Stop()
	clock.Advance(sleeping(time.Second))
	sleeping(2 * time.Second)
}
