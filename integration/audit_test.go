//go:build integration

package integration

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"

	"github.com/sluice-rls/sluice/internal/redistest"
)

// TestAuditTrailAcrossNodes: two nodes on one Redis and one rule directory
// each record their own reload, under their own node name, with the same
// subject (the rules' SHA-256), and `rls audit` (the binary) reads both
// back from the stream; a bad URL exits 2 without showing the password.
func TestAuditTrailAcrossNodes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr()
	dir := t.TempDir()
	rules := func(extra string) string {
		return "domain: r\ndescriptors:\n  - key: k\n" + extra + "    rate_limit: {unit: minute, requests_per_unit: 5}\n"
	}
	writeFile(t, dir, "rules.yaml", rules(""))
	a := startRLS(t, "--config", dir, "--redis", url)
	b := startRLS(t, "--config", dir, "--redis", url)
	writeFile(t, dir, "rules.yaml", rules("    detailed_metric: true\n"))
	waitForLog(t, a, "msg=audit")
	waitForLog(t, b, "msg=audit")
	a.Signal(t, syscall.SIGHUP) // the same files again: an event without changes

	type event struct {
		Kind, Node, Reason, Subject string
		Changes                     []struct{ What, Old, New string }
	}
	var events []event
	pollUntil(t, "three reloads in the stream", func() bool {
		out, errOut, code := runRLS(t, "audit", "--redis", url, "--kind", "reload", "--json")
		if code != 0 {
			t.Fatalf("rls audit: exit %d\n%s", code, errOut)
		}
		events = events[:0]
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var e event
			if line != "" && json.Unmarshal([]byte(line), &e) == nil {
				events = append(events, e)
			}
		}
		return len(events) == 3
	})
	// Newest first, but the two nodes write to the stream independently:
	// tell the SIGHUP reload by its reason.
	var sighup event
	var first []event
	for _, e := range events {
		if strings.HasPrefix(e.Reason, "reload requested") {
			sighup = e
		} else {
			first = append(first, e)
		}
	}
	if len(first) != 2 {
		t.Fatalf("events %+v: want one SIGHUP reload and two file reloads", events)
	}
	if !strings.HasPrefix(sighup.Reason, "reload requested") || len(sighup.Changes) != 0 {
		t.Errorf("newest event %+v, want the SIGHUP reload without changes", sighup)
	}
	if first[0].Node == first[1].Node || first[0].Subject != first[1].Subject || first[0].Subject != sighup.Subject || len(first[0].Subject) != 64 {
		t.Errorf("events %+v: want two nodes, one SHA-256 subject", events)
	}
	for _, e := range first {
		if len(e.Changes) != 1 || e.Changes[0].What != "r.k: detailed_metric" || e.Changes[0].Old != "false" || e.Changes[0].New != "true" {
			t.Errorf("event of %s: changes %+v, want r.k: detailed_metric false → true", e.Node, e.Changes)
		}
	}
	_, errOut, code := runRLS(t, "audit", "--redis", "redis://u:s3cret@127.0.0.1:notaport")
	if code != 2 || strings.Contains(errOut, "s3cret") {
		t.Errorf("rls audit with a bad URL: exit %d, %q; want 2, no password", code, errOut)
	}
}
