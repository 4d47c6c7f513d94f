package redisaudit

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/audit"
)

// Ranger is the go-redis call Read makes.
type Ranger interface {
	XRevRangeN(ctx context.Context, stream, start, stop string, count int64) *goredis.XMessageSliceCmd
}

// KindInvalid is the kind Read gives an entry of the stream that does not
// decode; its Reason says why.
const KindInvalid = "invalid"

// Query selects the events Read returns.
type Query struct {
	Stream string    // key of the stream; "": DefaultStream
	Count  int       // most events returned; ≤ 0: all that match
	Since  time.Time // only events added at or after Since (by the stream's IDs, Redis' clock); zero: all
	// Kind keeps events whose kind matches this path.Match pattern
	// ("reload", "override.*"); "": every kind.
	Kind string
}

// readPage is how many entries one XREVRANGE reads.
const readPage = 500

// Read returns the events of q, newest first. An entry that does not decode
// is returned as an event of kind "invalid" whose Reason says why, so that
// nothing in the stream is silently skipped.
func Read(ctx context.Context, c Ranger, q Query) ([]audit.Event, error) {
	if q.Stream == "" {
		q.Stream = DefaultStream
	}
	if q.Kind != "" {
		if _, err := path.Match(q.Kind, ""); err != nil {
			return nil, fmt.Errorf("kind pattern %q: %w", q.Kind, err)
		}
	}
	stop := "-"
	if !q.Since.IsZero() {
		stop = strconv.FormatInt(q.Since.UnixMilli(), 10)
	}
	var out []audit.Event
	start := "+"
	for {
		msgs, err := c.XRevRangeN(ctx, q.Stream, start, stop, readPage).Result()
		if err != nil {
			return nil, fmt.Errorf("reading audit stream %s: %w", q.Stream, err)
		}
		for _, m := range msgs {
			e := decode(m)
			if ok, _ := path.Match(q.Kind, e.Kind); q.Kind != "" && !ok {
				continue
			}
			out = append(out, e)
			if q.Count > 0 && len(out) == q.Count {
				return out, nil
			}
		}
		if len(msgs) < readPage {
			return out, nil
		}
		start = "(" + msgs[len(msgs)-1].ID // exclusive: Redis 6.2 and later
	}
}

// decode turns one stream entry back into an event.
func decode(m goredis.XMessage) audit.Event {
	str := func(k string) string { s, _ := m.Values[k].(string); return s }
	e := audit.Event{
		Kind:    str(fieldKind),
		Node:    str(fieldNode),
		Author:  str(fieldAuthor),
		Reason:  str(fieldReason),
		Subject: str(fieldSubject),
	}
	var problems []string
	if t, err := time.Parse(time.RFC3339Nano, str(fieldTime)); err == nil {
		e.Time = t
	} else {
		problems = append(problems, "time: "+err.Error())
	}
	if s := str(fieldChanges); s != "" {
		if err := json.Unmarshal([]byte(s), &e.Changes); err != nil {
			problems = append(problems, "changes: "+err.Error())
		}
	}
	if n := str(fieldChangesOmitted); n != "" {
		e.Changes = append(e.Changes, audit.Change{What: "(" + n + " more changes not kept in the stream; see the log)"})
	}
	if e.Kind == "" {
		problems = append(problems, "no kind")
	}
	if len(problems) > 0 {
		e.Reason = fmt.Sprintf("stream entry %s does not decode: %v", m.ID, problems)
		e.Kind = KindInvalid
	}
	return e
}
