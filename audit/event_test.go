package audit_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluice-rls/sluice/audit"
)

func TestLogWritesEveryField(t *testing.T) {
	var buf bytes.Buffer
	log := audit.Log{Logger: slog.New(slog.NewTextHandler(&buf, nil))}
	var rec audit.Recorder = audit.Multi{log}
	rec.Record(context.Background(), audit.Event{
		Time:    time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC),
		Kind:    audit.KindOverrideSet,
		Node:    "node-a",
		Author:  "alice",
		Reason:  "promotion",
		Subject: "ov-1",
		Changes: []audit.Change{{What: "edge.user_id: scale", Old: "1", New: "1.5"}},
	})
	got := buf.String()
	for _, want := range []string{
		"msg=audit", "kind=override.set", "at=2026-12-02T01:00:00.000Z", "node=node-a",
		"author=alice", "reason=promotion", "subject=ov-1",
		`"changes.edge.user_id: scale.old"=1`, `"changes.edge.user_id: scale.new"=1.5`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("log line %q lacks %q", got, want)
		}
	}
}

func TestLogOmitsEmptyFields(t *testing.T) {
	var buf bytes.Buffer
	audit.Log{Logger: slog.New(slog.NewTextHandler(&buf, nil))}.Record(context.Background(), audit.Event{Kind: audit.KindReload, Subject: "abc"})
	got := buf.String()
	for _, absent := range []string{"author=", "reason=", "node=", "changes"} {
		if strings.Contains(got, absent) {
			t.Errorf("log line %q has %q, want it left out when empty", got, absent)
		}
	}
}
