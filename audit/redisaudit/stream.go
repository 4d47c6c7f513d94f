package redisaudit

import (
	"context"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/audit"
)

// Defaults of Options (and of `rls serve --audit-stream`,
// `--audit-stream-max-len`).
const (
	// DefaultStream is the key of the audit stream.
	DefaultStream = "sluice:audit"
	// DefaultMaxLen is about how many events the stream keeps: older ones
	// are trimmed by every XADD (MAXLEN ~, so Redis trims whole nodes and
	// the stream may hold a little more).
	DefaultMaxLen = 10000
	// DefaultTimeout bounds one XADD.
	DefaultTimeout = time.Second
	// DefaultQueue is how many events wait for Redis before Record drops.
	DefaultQueue = 256
)

// maxChangesBytes caps the JSON of one event's changes in the stream: a
// reload of thousands of rules stays one entry of bounded size. Changes
// past the cap are left out and counted in the entry's "changes_omitted"
// field; the structured log has them all.
const maxChangesBytes = 256 << 10

// Adder is the go-redis call Writer makes. The client must apply context
// deadlines to its I/O (go-redis' ContextTimeoutEnabled, which
// backend/redis.ParseURL sets), or a stalled Redis holds a write past
// Timeout.
type Adder interface {
	XAdd(ctx context.Context, a *goredis.XAddArgs) *goredis.StringCmd
}

// Options configure a Writer.
type Options struct {
	Stream  string        // key of the stream; "": DefaultStream
	MaxLen  int64         // about how many events to keep; 0: DefaultMaxLen
	Timeout time.Duration // bound of one XADD; 0: DefaultTimeout
	Queue   int           // events waiting for Redis; 0: DefaultQueue
	Log     *slog.Logger  // failed writes, at warn level; nil: none
	Metrics *Metrics      // nil counts nothing
}

// Writer is an audit.Recorder appending events to a capped Redis stream.
// Build it with New; Record is safe for concurrent use and never blocks;
// Run writes what Record queued.
type Writer struct {
	opts  Options
	queue chan audit.Event
}

// New returns a Writer with opts' defaults filled in. Events recorded
// before Run starts wait in the queue.
func New(opts Options) *Writer {
	if opts.Stream == "" {
		opts.Stream = DefaultStream
	}
	if opts.MaxLen <= 0 {
		opts.MaxLen = DefaultMaxLen
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Queue <= 0 {
		opts.Queue = DefaultQueue
	}
	return &Writer{opts: opts, queue: make(chan audit.Event, opts.Queue)}
}

// Record queues e for the stream and returns at once; when the queue is
// full (Redis slow or away) it drops e and counts it as dropped.
func (w *Writer) Record(_ context.Context, e audit.Event) {
	select {
	case w.queue <- e:
	default:
		w.opts.Metrics.count(resultDropped)
		if w.opts.Log != nil {
			w.opts.Log.Warn("audit stream queue full; event dropped from the stream (it is in the log)", "kind", e.Kind, "subject", e.Subject)
		}
	}
}

// Run writes queued events to the stream, one XADD each under Timeout,
// until ctx is done. It then writes what is still queued for at most
// Timeout in all and returns; events recorded later are dropped by the
// full queue or left in it.
func (w *Writer) Run(ctx context.Context, c Adder) {
	for {
		select {
		case e := <-w.queue:
			w.write(ctx, c, e)
		case <-ctx.Done():
			w.flush(c)
			return
		}
	}
}

// flush writes the queued events, for at most Timeout in all.
func (w *Writer) flush(c Adder) {
	ctx, cancel := context.WithTimeout(context.Background(), w.opts.Timeout)
	defer cancel()
	for {
		select {
		case e := <-w.queue:
			if ctx.Err() != nil {
				w.opts.Metrics.count(resultFailed)
				continue
			}
			w.write(ctx, c, e)
		default:
			return
		}
	}
}

// write appends one event under its own timeout.
func (w *Writer) write(ctx context.Context, c Adder, e audit.Event) {
	ctx, cancel := context.WithTimeout(ctx, w.opts.Timeout)
	defer cancel()
	err := c.XAdd(ctx, &goredis.XAddArgs{
		Stream: w.opts.Stream,
		MaxLen: w.opts.MaxLen,
		Approx: true,
		Values: fields(e),
	}).Err()
	if err != nil {
		w.opts.Metrics.count(resultFailed)
		if w.opts.Log != nil {
			w.opts.Log.Warn("audit event not written to the Redis stream (it is in the log)", "stream", w.opts.Stream, "kind", e.Kind, "subject", e.Subject, "err", err)
		}
		return
	}
	w.opts.Metrics.count(resultWritten)
}

// Stream entry fields. An entry holds one event: its scalar fields as
// text (time in RFC 3339 with nanoseconds; empty ones left out) and its
// changes as a JSON array of {"what","old","new"}.
const (
	fieldTime           = "time"
	fieldKind           = "kind"
	fieldNode           = "node"
	fieldAuthor         = "author"
	fieldReason         = "reason"
	fieldSubject        = "subject"
	fieldChanges        = "changes"
	fieldChangesOmitted = "changes_omitted"
)

// fields renders e as the field-value list of one stream entry.
func fields(e audit.Event) []any {
	out := []any{fieldTime, e.Time.UTC().Format(time.RFC3339Nano), fieldKind, e.Kind}
	for _, f := range [...]struct{ k, v string }{{fieldNode, e.Node}, {fieldAuthor, e.Author}, {fieldReason, e.Reason}, {fieldSubject, e.Subject}} {
		if f.v != "" {
			out = append(out, f.k, f.v)
		}
	}
	if len(e.Changes) == 0 {
		return out
	}
	changes, omitted := capChanges(e.Changes)
	b, err := json.Marshal(changes)
	if err != nil { // strings only: cannot fail
		b = []byte("[]")
		omitted = len(e.Changes)
	}
	out = append(out, fieldChanges, string(b))
	if omitted > 0 {
		out = append(out, fieldChangesOmitted, omitted)
	}
	return out
}

// capChanges keeps the first changes whose JSON fits in maxChangesBytes and
// returns how many it left out.
func capChanges(cs []audit.Change) ([]audit.Change, int) {
	size := 2
	for i, c := range cs {
		// Each change costs its texts plus the keys, quotes and commas
		// around them; escaping may add more, hence the margin.
		size += len(c.What) + len(c.Old) + len(c.New) + 32
		if size > maxChangesBytes {
			return cs[:i], len(cs) - i
		}
	}
	return cs, 0
}

// Results of writes, the values of the result label.
const (
	resultWritten = "written"
	resultFailed  = "failed"
	resultDropped = "dropped"
)

// Metrics count what becomes of the events handed to a Writer. Build with
// NewMetrics; nil counts nothing.
type Metrics struct {
	events *prometheus.CounterVec
}

// NewMetrics creates ratelimit_audit_stream_events_total on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{events: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ratelimit_audit_stream_events_total",
		Help: "Audit events handed to the Redis audit stream, by result: written, failed (Redis error or timeout) or dropped (queue full).",
	}, []string{"result"})}
	for _, r := range []string{resultWritten, resultFailed, resultDropped} {
		m.events.WithLabelValues(r)
	}
	reg.MustRegister(m.events)
	return m
}

func (m *Metrics) count(result string) {
	if m != nil {
		m.events.WithLabelValues(result).Inc()
	}
}
