package redisaudit_test

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/audit/redisaudit"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/redistest"
	"github.com/sluice-rls/sluice/ruleset"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var at = time.Date(2026, 12, 2, 1, 0, 0, 123456789, time.UTC)

var events = []audit.Event{
	{Time: at, Kind: audit.KindReload, Node: "n1:7", Reason: "rule files changed: /etc/rules", Subject: "ab12",
		Changes: []audit.Change{{What: "edge.k: share_threshold", Old: "false", New: "true"}, {What: "edge.new", New: "global.burst=1"}}},
	{Time: at.Add(time.Second), Kind: audit.KindOverrideSet, Node: "n2:8", Author: "alice", Reason: "sale \"today\"", Subject: "ov-1",
		Changes: []audit.Change{{What: "edge.k: scale", Old: "1", New: "2"}}},
	{Time: at.Add(2 * time.Second), Kind: audit.KindOverrideExpire, Node: "n1:7", Subject: "ov-1"},
}

// writer starts w.Run on c; the returned stop ends it and waits.
func run(t *testing.T, w *redisaudit.Writer, c redisaudit.Adder) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, c) }()
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

// waitLen polls XLEN until it reaches n.
func waitLen(t *testing.T, c goredis.UniversalClient, stream string, n int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := c.XLen(context.Background(), stream).Result()
		if err == nil && got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("stream %s holds %d entries (err %v), want %d", stream, got, err, n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func reversed(es []audit.Event) []audit.Event {
	out := make([]audit.Event, len(es))
	for i, e := range es {
		out[len(es)-1-i] = e
	}
	return out
}

func TestWriteAndRead(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	reg := prometheus.NewRegistry()
	w := redisaudit.New(redisaudit.Options{Metrics: redisaudit.NewMetrics(reg)})
	for _, e := range events { // queued before Run: kept
		w.Record(context.Background(), e)
	}
	run(t, w, c)
	waitLen(t, c, redisaudit.DefaultStream, 3)

	ctx := context.Background()
	got, err := redisaudit.Read(ctx, c, redisaudit.Query{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(reversed(events), got); diff != "" {
		t.Errorf("Read, all: -want +got\n%s", diff)
	}
	for _, tt := range []struct {
		q    redisaudit.Query
		want []audit.Event
	}{
		{redisaudit.Query{Count: 1}, []audit.Event{events[2]}},
		{redisaudit.Query{Kind: "override.*"}, []audit.Event{events[2], events[1]}},
		{redisaudit.Query{Kind: "reload"}, []audit.Event{events[0]}},
		{redisaudit.Query{Since: time.Now().Add(time.Hour)}, nil},
		{redisaudit.Query{Since: time.Now().Add(-time.Hour), Count: 2}, []audit.Event{events[2], events[1]}},
		{redisaudit.Query{Stream: "other"}, nil},
	} {
		got, err := redisaudit.Read(ctx, c, tt.q)
		if err != nil {
			t.Fatalf("Read(%+v): %v", tt.q, err)
		}
		if diff := cmp.Diff(tt.want, got); diff != "" {
			t.Errorf("Read(%+v): -want +got\n%s", tt.q, diff)
		}
	}
	if _, err := redisaudit.Read(ctx, c, redisaudit.Query{Kind: "["}); err == nil {
		t.Error("Read with a bad kind pattern: no error")
	}
	if got := counter(t, reg, "written"); got != 3 {
		t.Errorf("written = %v, want 3", got)
	}
	// An entry someone else wrote is shown, not skipped.
	if err := c.XAdd(ctx, &goredis.XAddArgs{Stream: redisaudit.DefaultStream, Values: []any{"foo", "bar"}}).Err(); err != nil {
		t.Fatal(err)
	}
	got, err = redisaudit.Read(ctx, c, redisaudit.Query{Count: 1})
	if err != nil || len(got) != 1 || got[0].Kind != "invalid" {
		t.Errorf("Read of a foreign entry: %+v, %v; want one event of kind invalid", got, err)
	}
}

// counter reads ratelimit_audit_stream_events_total{result}.
func counter(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if mf.GetName() == "ratelimit_audit_stream_events_total" && m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("no ratelimit_audit_stream_events_total{result=%q}", result)
	return 0
}

// TestStreamIsCapped: MAXLEN ~ keeps about MaxLen events; Redis trims whole
// nodes of stream-node-max-entries, so at most that many more.
func TestStreamIsCapped(t *testing.T) {
	srv := redistest.Start(t, redistest.WithArgs("--stream-node-max-entries", "4"))
	c := srv.Client()
	w := redisaudit.New(redisaudit.Options{Stream: "capped", MaxLen: 10, Queue: 300})
	for i := range 200 {
		w.Record(context.Background(), audit.Event{Time: at, Kind: audit.KindReload, Subject: "s" + string(rune('a'+i%26))})
	}
	w.Record(context.Background(), audit.Event{Time: at, Kind: audit.KindReload, Subject: "last"})
	stop := run(t, w, c)
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, err := redisaudit.Read(context.Background(), c, redisaudit.Query{Stream: "capped", Count: 1})
		if err == nil && len(got) == 1 && got[0].Subject == "last" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the last event never arrived: %+v, %v", got, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	n, err := c.XLen(context.Background(), "capped").Result()
	if err != nil {
		t.Fatal(err)
	}
	if n < 10 || n > 10+4 {
		t.Errorf("after 201 events with MaxLen 10, the stream holds %d, want 10 to 14", n)
	}
}

// TestStalledRedisBlocksNothing: with Redis stopped (SIGSTOP), a reload
// recording through the Writer returns at once, events past the queue are
// dropped and counted, and Run ends within its bounds when asked.
func TestStalledRedisBlocksNothing(t *testing.T) {
	srv := redistest.Start(t)
	// As backend/redis.ParseURL builds it: deadlines from contexts, no
	// retries.
	c := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil { // a pooled connection, then stall
		t.Fatal(err)
	}
	srv.Stall()
	t.Cleanup(srv.Resume)
	reg := prometheus.NewRegistry()
	// A write timeout far above what 10 reloads take even on a loaded
	// machine (400 ms seen with the CPUs shared): a Record that waited for
	// Redis would show as a whole timeout, and the first write stays in
	// flight for the whole loop, so the count of drops is exact.
	const timeout = time.Second
	w := redisaudit.New(redisaudit.Options{Timeout: timeout, Queue: 2, Metrics: redisaudit.NewMetrics(reg), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	stop := run(t, w, c)

	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	write := func(n string) {
		if err := os.WriteFile(file, []byte("domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: "+n+"}}]\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("1")
	cfg, err := ruleset.Load(dir, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &ruleset.Reloader{Path: dir, Store: ruleset.NewStore(cfg), Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Audit: w, Node: "n"}
	start := time.Now()
	for i := range 10 {
		write(strconv.Itoa(i + 2))
		if err := r.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	took := time.Since(start)
	t.Logf("10 reloads with Redis stalled took %v", took)
	if took > timeout {
		t.Errorf("10 reloads took %v with Redis stalled, want well under one write timeout (%v)", took, timeout)
	}
	if got := counter(t, reg, "dropped"); got < 7 {
		t.Errorf("dropped = %v, want at least 7 of 10 (queue 2, one write in flight)", got)
	}
	start = time.Now()
	stop()
	took = time.Since(start)
	t.Logf("Run ended %v after it was asked to", took)
	if took > 3*timeout {
		t.Errorf("Run took %v to end, want at most the write in flight and one flush (%v each)", took, timeout)
	}
	if got := counter(t, reg, "written"); got != 0 {
		t.Errorf("written = %v with Redis stalled, want 0", got)
	}
}

// TestCluster: the stream is one key; a Redis Cluster holds it like a single
// Redis.
func TestCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	c := cl.Client()
	w := redisaudit.New(redisaudit.Options{})
	for _, e := range events {
		w.Record(context.Background(), e)
	}
	run(t, w, c)
	waitLen(t, c, redisaudit.DefaultStream, 3)
	got, err := redisaudit.Read(context.Background(), c, redisaudit.Query{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(reversed(events), got); diff != "" {
		t.Errorf("Read from the cluster: -want +got\n%s", diff)
	}
}

// TestLargeEventIsCapped: a reload of thousands of rules stays one entry
// of bounded size; the changes left out are counted, and Read says so.
func TestLargeEventIsCapped(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	w := redisaudit.New(redisaudit.Options{})
	big := audit.Event{Time: at, Kind: audit.KindReload, Subject: "big"}
	for i := range 10000 {
		big.Changes = append(big.Changes, audit.Change{What: "edge.rule_" + strconv.Itoa(i), New: strings.Repeat("x", 80)})
	}
	w.Record(context.Background(), big)
	run(t, w, c)
	waitLen(t, c, redisaudit.DefaultStream, 1)
	msgs, err := c.XRange(context.Background(), redisaudit.DefaultStream, "-", "+").Result()
	if err != nil || len(msgs) != 1 {
		t.Fatalf("XRANGE: %v, %v", msgs, err)
	}
	changes, _ := msgs[0].Values["changes"].(string)
	if n := len(changes); n > 256<<10 || n < 128<<10 {
		t.Errorf("changes field holds %d bytes, want at most 256 KiB (and most of it)", n)
	}
	got, err := redisaudit.Read(context.Background(), c, redisaudit.Query{})
	if err != nil || len(got) != 1 {
		t.Fatalf("Read: %v, %v", got, err)
	}
	kept := len(got[0].Changes) - 1
	last := got[0].Changes[kept].What
	if want := "(" + strconv.Itoa(10000-kept) + " more changes not kept in the stream; see the log)"; kept <= 0 || kept >= 10000 || last != want {
		t.Errorf("read back %d changes then %q, want fewer than 10000 and %q", kept, last, want)
	}
}
