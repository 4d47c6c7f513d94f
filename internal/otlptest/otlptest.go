// Package otlptest is an in-process OpenTelemetry collector for tests: a
// real server on 127.0.0.1 taking OTLP traces over gRPC (Start, OTLP's
// TraceService) or HTTP/protobuf (StartHTTP, POST /v1/traces), which keeps
// every span it receives and the headers of the last export.
package otlptest

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"
)

// Span is one received span with its resource's attributes.
type Span struct {
	*tracepb.Span
	Resource map[string]string
}

// TraceID is the span's trace id in hex, as in a traceparent.
func (s Span) TraceID() string { return hex.EncodeToString(s.Span.GetTraceId()) }

// SpanID is the span's id in hex.
func (s Span) SpanID() string { return hex.EncodeToString(s.Span.GetSpanId()) }

// ParentID is the span's parent id in hex ("" for a root span).
func (s Span) ParentID() string { return hex.EncodeToString(s.Span.GetParentSpanId()) }

// Attr returns the span attribute key as a string (ints in decimal, bools
// as true/false), and whether the span has it.
func (s Span) Attr(key string) (string, bool) {
	return attr(s.GetAttributes(), key)
}

func attr(kvs []*commonpb.KeyValue, key string) (string, bool) {
	for _, kv := range kvs {
		if kv.GetKey() == key {
			return valueString(kv.GetValue()), true
		}
	}
	return "", false
}

func valueString(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return strconv.FormatInt(x.IntValue, 10)
	case *commonpb.AnyValue_BoolValue:
		if x.BoolValue {
			return "true"
		}
		return "false"
	}
	return v.String()
}

// Collector is a running OTLP/gRPC trace receiver.
type Collector struct {
	collectortrace.UnimplementedTraceServiceServer

	addr    string
	mu      sync.Mutex
	spans   []Span
	exports int                 // Export calls received
	header  map[string][]string // of the last export: gRPC metadata or HTTP headers, lower-case keys
}

// Start serves a Collector on 127.0.0.1 (plaintext) until the test ends.
func Start(t testing.TB) *Collector {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("otlptest: %v", err)
	}
	c := &Collector{addr: lis.Addr().String()}
	srv := grpc.NewServer()
	collectortrace.RegisterTraceServiceServer(srv, c)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return c
}

// StartHTTP serves a Collector taking OTLP/HTTP (protobuf, gzip or not)
// on POST /v1/traces at 127.0.0.1 (plaintext) until the test ends.
func StartHTTP(t testing.TB) *Collector {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("otlptest: %v", err)
	}
	c := &Collector{addr: lis.Addr().String()}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/traces", c.serveHTTP)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return c
}

// serveHTTP is OTLP/HTTP's trace export: a protobuf
// ExportTraceServiceRequest in, an ExportTraceServiceResponse out.
func (c *Collector) serveHTTP(w http.ResponseWriter, r *http.Request) {
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	data, err := io.ReadAll(io.LimitReader(body, 64<<20))
	req := &collectortrace.ExportTraceServiceRequest{}
	if err == nil {
		err = proto.Unmarshal(data, req)
	}
	if err != nil || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, fmt.Sprintf("want a protobuf ExportTraceServiceRequest: %v", err), http.StatusBadRequest)
		return
	}
	header := map[string][]string{}
	for k, v := range r.Header {
		header[strings.ToLower(k)] = v
	}
	c.keep(req, header)
	out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Addr is the collector's host:port, for --tracing-endpoint.
func (c *Collector) Addr() string { return c.addr }

// Header returns the values of the header (gRPC metadata for Start) key,
// lower-case, of the last export received.
func (c *Collector) Header(key string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.header[key]
}

// Export implements OTLP's TraceService: it keeps the request's spans.
func (c *Collector) Export(ctx context.Context, req *collectortrace.ExportTraceServiceRequest) (*collectortrace.ExportTraceServiceResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c.keep(req, md)
	return &collectortrace.ExportTraceServiceResponse{}, nil
}

// keep stores the spans of one export, and its headers.
func (c *Collector) keep(req *collectortrace.ExportTraceServiceRequest, header map[string][]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.exports++
	c.header = header
	for _, rs := range req.GetResourceSpans() {
		res := map[string]string{}
		for _, kv := range rs.GetResource().GetAttributes() {
			res[kv.GetKey()] = valueString(kv.GetValue())
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, sp := range ss.GetSpans() {
				c.spans = append(c.spans, Span{Span: sp, Resource: res})
			}
		}
	}
}

// Spans returns the spans received so far.
func (c *Collector) Spans() []Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Span(nil), c.spans...)
}

// Exports returns the number of Export calls received.
func (c *Collector) Exports() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.exports
}

// WaitSpans polls until at least n spans have arrived, failing the test
// after timeout, and returns them.
func (c *Collector) WaitSpans(t testing.TB, n int, timeout time.Duration) []Span {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if s := c.Spans(); len(s) >= n {
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("otlptest: %d spans after %v, want %d: %v", len(c.Spans()), timeout, n, names(c.Spans()))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Named returns the spans called name.
func Named(spans []Span, name string) []Span {
	var out []Span
	for _, s := range spans {
		if s.GetName() == name {
			out = append(out, s)
		}
	}
	return out
}

func names(spans []Span) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.GetName()
	}
	return out
}
