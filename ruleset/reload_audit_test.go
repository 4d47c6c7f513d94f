package ruleset_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/internal/audittest"
)

const shareRules = "domain: d\ndescriptors:\n  - key: k\n    value: \"v*\"\n    SHARE\n    rate_limit: {unit: second, requests_per_unit: 10}\n"

// TestReloadRecordsAuditEvent: a reload that changes only share_threshold
// (logged as changed=0 before Diff compared every field) records one event:
// the files' SHA-256, the node, the clock's time and the field old → new.
// A failed reload records nothing; reloading the same files records the
// same subject and no change.
func TestReloadRecordsAuditEvent(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	must(t, os.WriteFile(file, []byte(strings.Replace(shareRules, "    SHARE\n", "", 1)), 0o644))
	f := newFixture(t, dir)
	rec := &audittest.Recorder{}
	clock := clockwork.NewFakeClockAt(time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC))
	f.r.Audit, f.r.Node, f.r.Clock = rec, "node-a:42", clock

	must(t, os.WriteFile(file, []byte("domain: d\ndescriptors: [{key: k, rate_limit: {unit: fortnight}}]\n"), 0o644))
	if err := f.r.Reload(); err == nil {
		t.Fatal("Reload of a bad file succeeded")
	}
	if ev := rec.Events(); len(ev) != 0 {
		t.Fatalf("a failed reload recorded %+v, want nothing", ev)
	}

	must(t, os.WriteFile(file, []byte(strings.Replace(shareRules, "SHARE", "share_threshold: true", 1)), 0o644))
	if err := f.r.Reload(); err != nil {
		t.Fatal(err)
	}
	ev := rec.Events()
	if len(ev) != 1 {
		t.Fatalf("recorded %d events, want 1: %+v", len(ev), ev)
	}
	e := ev[0]
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(e.Subject) {
		t.Errorf("Subject = %q, want a hex SHA-256", e.Subject)
	}
	if e.Kind != audit.KindReload || e.Node != "node-a:42" || !e.Time.Equal(clock.Now()) || e.Author != "" || e.Reason != "reload requested: "+dir {
		t.Errorf("event = %+v, want kind reload, node node-a:42, time %v, no author, reason %q", e, clock.Now(), "reload requested: "+dir)
	}
	want := []audit.Change{{What: "d.k_v*: levels[0].share_threshold", Old: "false", New: "true"}}
	if diff := cmp.Diff(want, e.Changes); diff != "" {
		t.Errorf("Changes: -want +got\n%s", diff)
	}
	if !strings.Contains(f.log.String(), "sha256="+e.Subject) {
		t.Errorf("the reload's log line lacks sha256=%s:\n%s", e.Subject, f.log)
	}

	if err := f.r.Reload(); err != nil {
		t.Fatal(err)
	}
	ev = rec.Events()
	if len(ev) != 2 || ev[1].Subject != e.Subject || len(ev[1].Changes) != 0 {
		t.Errorf("reloading the same files: %+v, want a second event, subject %s, no changes", ev[1:], e.Subject)
	}
}
