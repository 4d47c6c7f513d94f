package xds_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	cachev3 "github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/audittest"
	"github.com/sluice-rls/sluice/internal/logtest"
	"github.com/sluice-rls/sluice/internal/xdstest"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/xds"
)

// deepConfig is a RateLimitConfig whose descriptors nest levels deep.
func deepConfig(name string, levels int) *rlsconfv3.RateLimitConfig {
	cfg := &rlsconfv3.RateLimitConfig{Name: name, Domain: name}
	next := &cfg.Descriptors
	for i := range levels {
		d := &rlsconfv3.RateLimitDescriptor{Key: "k", Value: "v"}
		if i == levels-1 {
			d.RateLimit = &rlsconfv3.RateLimitPolicy{Unit: rlsconfv3.RateLimitUnit_MINUTE, RequestsPerUnit: 1}
		}
		*next = append(*next, d)
		next = &d.Descriptors
	}
	return cfg
}

// source is a Source on a fake clock logging JSON into logs, recording
// audit events into rec, started against addr and stopped at the end of
// the test.
type source struct {
	src   *xds.Source
	store *ruleset.Store
	reg   *prometheus.Registry
	clock *clockwork.FakeClock
	logs  *logtest.Buffer
	rec   *audittest.Recorder
}

func runSource(t *testing.T, addr string) *source {
	t.Helper()
	empty, err := descriptors.New(nil, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	s := &source{store: ruleset.NewStore(empty), reg: prometheus.NewRegistry(), clock: clockwork.NewFakeClock(), logs: &logtest.Buffer{}, rec: &audittest.Recorder{}}
	s.src, err = xds.New(xds.Options{
		Server: addr, NodeID: node, Store: s.store,
		Log:        slog.New(slog.NewJSONHandler(s.logs, nil)),
		Reloads:    ruleset.NewReloadMetrics(s.reg),
		Audit:      s.rec,
		Clock:      s.clock,
		BackoffMin: time.Second, BackoffMax: 8 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		_ = s.src.Run(ctx)
	}()
	t.Cleanup(func() { cancel(); <-stopped })
	return s
}

// logLines are the JSON log lines whose msg contains sub, raw.
func logLines(logs, sub string) []string {
	var out []string
	for _, line := range strings.Split(logs, "\n") {
		var m struct{ Msg string }
		if json.Unmarshal([]byte(line), &m) == nil && strings.Contains(m.Msg, sub) {
			out = append(out, line)
		}
	}
	return out
}

// waits are the "in" of the log lines whose msg contains sub.
func waits(logs, sub string) []time.Duration {
	var out []time.Duration
	for _, line := range logLines(logs, sub) {
		var m struct{ In time.Duration }
		if json.Unmarshal([]byte(line), &m) == nil {
			out = append(out, m.In)
		}
	}
	return out
}

// TestDeepResourceIsRefusedCheaply: a resource nested 9,990 levels deep
// (under protobuf's own limit of 10,000) is refused with a NACK naming the
// depth limit, for little work: a few MB allocated in the whole process,
// where rendering it as a rule file and logging that cost gigabytes and a
// 400 MB log line. The rejection is logged in one short line.
func TestDeepResourceIsRefusedCheaply(t *testing.T) {
	mgmt := xdstest.Start(t, "")
	mgmt.Set(t, node, "v1", limit("edge", "user", "alice", 10))
	s := runSource(t, mgmt.Addr)
	mgmt.WaitRequest(t, xdstest.ACK("v1"))

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	mgmt.Set(t, node, "deep", deepConfig("deep", 9990))
	nack := mgmt.WaitRequest(t, xdstest.NACK)
	runtime.ReadMemStats(&after)

	if msg := nack.GetErrorDetail().GetMessage(); !strings.Contains(msg, "xds:deep") || !strings.Contains(msg, "--xds-max-depth") || len(msg) > 1024 {
		t.Errorf("NACK detail (%d bytes) %.300q, want a short one naming xds:deep and --xds-max-depth", len(msg), msg)
	}
	// Generous: the server's own marshalling of the resource is in it too.
	alloc := after.TotalAlloc - before.TotalAlloc
	t.Logf("refusing %d levels: %d KB allocated, log %d bytes", 9990, alloc>>10, len(s.logs.String()))
	if alloc > 64<<20 {
		t.Errorf("refusing the deep resource allocated %d MB, want under 64 MB", alloc>>20)
	}
	lines := logLines(s.logs.String(), "rejected")
	if len(lines) == 0 {
		t.Fatalf("no rejection logged:\n%.2000s", s.logs.String())
	}
	for _, l := range lines {
		if len(l) > 1024 {
			t.Errorf("rejection log line of %d bytes, want under 1 KB: %.300s…", len(l), l)
		}
	}
	if !strings.Contains(lines[0], `"resource":"xds:deep"`) || !strings.Contains(lines[0], `"bytes":`) {
		t.Errorf("rejection line %s, want the resource's name and size", lines[0])
	}
	if got := requestsOf(s.store.Rules(), "edge", "user", "alice"); got != 10 {
		t.Errorf("after the NACK edge user=alice allows %d/min, want v1's 10", got)
	}
}

// TestNACKsBackOff: a management server sends a refused update again as
// soon as it is NACKed (go-control-plane's snapshot cache does); the
// source's NACKs in a row are spaced by a wait that doubles from
// BackoffMin to BackoffMax: one refusal per wait, not a loop.
func TestNACKsBackOff(t *testing.T) {
	mgmt := xdstest.Start(t, "")
	bad := limit("edge", "user", "alice", 10)
	bad.Descriptors[0].RateLimit.Unit = rlsconfv3.RateLimitUnit_UNKNOWN
	mgmt.Set(t, node, "bad", bad)
	s := runSource(t, mgmt.Addr)
	mgmt.WaitRequest(t, xdstest.NACK)

	errs := func() float64 { return gauge(t, s.reg, "ratelimit_config_loads_total", "result", "error") }
	bounds := []time.Duration{1, 2, 4, 8, 8, 8} // seconds: BackoffMin doubling, capped at BackoffMax
	for i, d := range bounds {
		blockUntilSleeping(t, s.clock)
		// The refusal that waits is counted; no other came meanwhile.
		if got := errs(); got != float64(i+2) {
			t.Fatalf("wait %d: %v refusals, want %d", i+1, got, i+2)
		}
		w := waits(s.logs.String(), "waiting before the NACK")
		if len(w) != i+1 {
			t.Fatalf("%d NACK waits logged, want %d", len(w), i+1)
		}
		if got, d := w[i], d*time.Second; got < d/2 || got > d {
			t.Errorf("wait %d: %v, want within [%v, %v]", i+1, got, d/2, d)
		}
		s.clock.Advance(w[i])
		mgmt.WaitRequest(t, xdstest.NACK)
	}
	// A good update is ACKed, and the NACK backoff starts over.
	blockUntilSleeping(t, s.clock)
	mgmt.Set(t, node, "good", limit("edge", "user", "alice", 10))
	s.clock.Advance(8 * time.Second)
	mgmt.WaitRequest(t, xdstest.ACK("good"))
	mgmt.Set(t, node, "bad2", bad)
	mgmt.WaitRequest(t, xdstest.NACK) // the first NACK goes at once
	blockUntilSleeping(t, s.clock)
	if w := waits(s.logs.String(), "waiting before the NACK"); w[len(w)-1] > time.Second {
		t.Errorf("first wait after an ACK: %v, want at most BackoffMin (1s)", w[len(w)-1])
	}
}

// closingServer is a go-control-plane management server that ends every
// stream as soon as the client answers a response, and then publishes the
// same resources under a new version, so that each reconnect gets them
// again: the reconnect loop a broken or hostile server makes.
type closingServer struct {
	addr    string
	mu      sync.Mutex
	streams int
}

func startClosingServer(t *testing.T, cfgs ...*rlsconfv3.RateLimitConfig) *closingServer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cache := cachev3.NewSnapshotCache(false, cachev3.IDHash{}, nil)
	res := make([]types.Resource, len(cfgs))
	for i, c := range cfgs {
		res[i] = c
	}
	version := 0
	publish := func() error {
		version++
		snap, err := cachev3.NewSnapshot(fmt.Sprintf("v%d", version), map[resource.Type][]types.Resource{resource.RateLimitConfigType: res})
		if err != nil {
			return err
		}
		return cache.SetSnapshot(context.Background(), node, snap)
	}
	if err := publish(); err != nil {
		t.Fatal(err)
	}
	s := &closingServer{addr: lis.Addr().String()}
	callbacks := serverv3.CallbackFuncs{
		StreamOpenFunc: func(context.Context, int64, string) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.streams++
			return nil
		},
		StreamRequestFunc: func(_ int64, req *discovery.DiscoveryRequest) error {
			if req.GetResponseNonce() == "" {
				return nil // the subscription
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			if err := publish(); err != nil {
				return err
			}
			return context.Canceled // ends the stream
		},
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := grpc.NewServer()
	discovery.RegisterAggregatedDiscoveryServiceServer(srv, serverv3.NewServer(ctx, cache, callbacks))
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(lis) }()
	t.Cleanup(func() { srv.Stop(); cancel(); <-done })
	return s
}

func (s *closingServer) opened() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams
}

// TestReconnectsBackOff: against a server that closes every stream after
// one response, the waits between reconnects double up to BackoffMax
// (a stream that got an update but lived a moment is no healthy one), and
// the same rules under each new version write no audit event.
func TestReconnectsBackOff(t *testing.T) {
	srv := startClosingServer(t, limit("edge", "user", "alice", 10))
	s := runSource(t, srv.addr)
	bounds := []time.Duration{1, 2, 4, 8, 8, 8} // seconds
	for i, d := range bounds {
		blockUntilSleeping(t, s.clock)
		if got := srv.opened(); got != i+1 {
			t.Fatalf("after %d waits: %d streams opened, want %d", i, got, i+1)
		}
		w := waits(s.logs.String(), "reconnecting")
		if len(w) != i+1 {
			t.Fatalf("%d reconnect waits logged, want %d", len(w), i+1)
		}
		if got, d := w[i], d*time.Second; got < d/2 || got > d {
			t.Errorf("wait %d: %v, want within [%v, %v]", i+1, got, d/2, d)
		}
		s.clock.Advance(w[i])
	}
	if got := requestsOf(s.store.Rules(), "edge", "user", "alice"); got != 10 {
		t.Errorf("edge user=alice allows %d/min, want 10", got)
	}
	ev := s.rec.Events()
	if len(ev) != 1 || ev[0].Kind != audit.KindReload {
		t.Errorf("%d audit events, want 1 (the first update; the same rules again change nothing): %+v", len(ev), ev)
	}
}

// TestLargeUpdateIsSummed: an update changing 500 rules lists 100 of
// them in its audit event and its log, and sums up the rest in one
// audit change and one log line, where both held one entry per rule
// (a 32.7 MB audit line for 100,000 domains).
func TestLargeUpdateIsSummed(t *testing.T) {
	const n = 500
	cfgs := make([]*rlsconfv3.RateLimitConfig, n)
	for i := range cfgs {
		cfgs[i] = limit(fmt.Sprintf("domain-%04d", i), "user", "alice", 10)
	}
	mgmt := xdstest.Start(t, "")
	mgmt.Set(t, node, "v1", cfgs...)
	s := runSource(t, mgmt.Addr)
	// Set-up on a busy machine under -race may take longer than
	// WaitRequest's bound: poll for the event with a generous one.
	for deadline := time.Now().Add(2 * time.Minute); len(s.rec.Events()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the update was not applied within 2 minutes")
		}
	}
	if got := s.store.Rules().Len(); got != n {
		t.Fatalf("%d rules, want %d", got, n)
	}
	ev := s.rec.Events()
	if len(ev) != 1 {
		t.Fatalf("%d audit events, want 1", len(ev))
	}
	ch := ev[0].Changes
	if len(ch) != 101 {
		t.Fatalf("%d audit changes, want 100 and a summary", len(ch))
	}
	if last := ch[100]; last.What != "(more changes not listed)" || last.New != "500 rules added, 0 removed, 0 changed; 100 listed" {
		t.Errorf("summary change %+v", last)
	}
	if b, _ := json.Marshal(ev[0]); len(b) > 64<<10 {
		t.Errorf("audit event of %d bytes, want under 64 KB", len(b))
	}
	logs := s.logs.String()
	if got := len(logLines(logs, "rule added")); got != 100 {
		t.Errorf("%d \"rule added\" lines, want 100", got)
	}
	if l := logLines(logs, "more rule changes not listed"); len(l) != 1 || !strings.Contains(l[0], `"not_listed":400`) {
		t.Errorf("summary log lines %q, want one counting 400 more", l)
	}
	if len(logs) > 256<<10 {
		t.Errorf("%d bytes of logs for the update, want under 256 KB", len(logs))
	}
}
