package tracing

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// gateExporter counts exported spans; while gate is open (not nil and not
// closed), ExportSpans waits on it.
type gateExporter struct {
	mu      sync.Mutex
	batches []int
	gate    chan struct{}
	entered chan struct{} // receives once per export
}

func (e *gateExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.entered <- struct{}{}
	if e.gate != nil {
		<-e.gate
	}
	e.mu.Lock()
	e.batches = append(e.batches, len(spans))
	e.mu.Unlock()
	return nil
}

func (e *gateExporter) Shutdown(context.Context) error { return nil }

func (e *gateExporter) total() (n int, batches []int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, b := range e.batches {
		n += b
	}
	return n, append([]int(nil), e.batches...)
}

func span(sampled bool) sdktrace.ReadOnlySpan {
	flags := trace.TraceFlags(0)
	if sampled {
		flags = trace.FlagsSampled
	}
	return tracetest.SpanStub{SpanContext: trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: flags,
	})}.Snapshot()
}

// TestBatcher: a full batch is exported at once (not at the timeout), a
// full queue drops, unsampled spans are not queued, and Shutdown exports
// what is left in batches of at most maxBatch.
func TestBatcher(t *testing.T) {
	exp := &gateExporter{gate: make(chan struct{}), entered: make(chan struct{}, 100)}
	b := newBatcher(exp, time.Hour, slog.New(slog.DiscardHandler))
	for range maxBatch {
		b.OnEnd(span(true))
		b.OnEnd(span(false))
	}
	select {
	case <-exp.entered: // the full batch woke the goroutine; it now waits at the gate
	case <-time.After(10 * time.Second):
		t.Fatal("a full batch was not exported before the batch timeout")
	}
	const extra = maxQueue + 100
	for range extra {
		b.OnEnd(span(true))
	}
	close(exp.gate)
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	n, batches := exp.total()
	if want := maxBatch + maxQueue; n != want {
		t.Fatalf("exported %d spans in %v, want %d (one batch, then a full queue; %d dropped)", n, batches, want, extra-maxQueue)
	}
	for _, s := range batches {
		if s > maxBatch {
			t.Errorf("a batch of %d spans, more than %d", s, maxBatch)
		}
	}
	// After Shutdown: nothing more, and a second Shutdown does nothing.
	b.OnEnd(span(true))
	if err := b.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n2, _ := exp.total(); n2 != n {
		t.Errorf("exported %d after a second Shutdown, want %d", n2, n)
	}
}

// TestBatcherTimeout: spans short of a batch go at the batch timeout.
func TestBatcherTimeout(t *testing.T) {
	exp := &gateExporter{entered: make(chan struct{}, 100)}
	b := newBatcher(exp, 20*time.Millisecond, slog.New(slog.DiscardHandler))
	defer b.Shutdown(context.Background())
	b.OnEnd(span(true))
	deadline := time.Now().Add(10 * time.Second)
	for {
		if n, _ := exp.total(); n == 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("a lone span was not exported at the batch timeout")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// nameExporter records the names of each batch as it is exported.
type nameExporter struct{ batches [][]string }

func (e *nameExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	e.batches = append(e.batches, names)
	return nil
}

func (e *nameExporter) Shutdown(context.Context) error { return nil }

// TestBatcherReusesSlices: the queue and the spare slice take turns, and
// each export sends the spans queued since the last one, no older ones.
func TestBatcherReusesSlices(t *testing.T) {
	exp := &nameExporter{}
	b := newBatcher(exp, time.Hour, slog.New(slog.DiscardHandler))
	defer b.Shutdown(context.Background())
	end := func(names ...string) {
		for _, n := range names {
			b.OnEnd(tracetest.SpanStub{Name: n, SpanContext: span(true).SpanContext()}.Snapshot())
		}
		if err := b.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	end("a", "b", "c")
	end("d", "e")
	end("f")
	want := "[[a b c] [d e] [f]]"
	if got := fmt.Sprint(exp.batches); got != want {
		t.Fatalf("batches %s, want %s", got, want)
	}
}
