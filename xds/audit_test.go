package xds_test

import (
	"context"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/descriptors"
	"github.com/sluice-rls/sluice/internal/audittest"
	"github.com/sluice-rls/sluice/internal/xdstest"
	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/xds"
)

// TestUpdatesAreAudited: every applied update records one reload event
// whose subject is the version and the SHA-256 of the rules, with every
// changed field; a NACKed update records nothing, and neither does an
// update that changes nothing (the same rules under a new version).
func TestUpdatesAreAudited(t *testing.T) {
	mgmt := xdstest.Start(t, "")
	mgmt.Set(t, node, "v1", limit("edge", "user", "alice", 10))
	empty, err := descriptors.New(nil, descriptors.Options{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &audittest.Recorder{}
	clock := clockwork.NewFakeClock()
	src, err := xds.New(xds.Options{
		Server: mgmt.Addr, NodeID: node,
		Store: ruleset.NewStore(empty), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Clock: clock, Audit: rec, AuditNode: "node-a:1",
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = src.Run(ctx) }()
	defer func() { cancel(); <-done }()

	mgmt.WaitRequest(t, xdstest.ACK("v1"))
	mgmt.Set(t, node, "v2", limit("edge", "user", "alice", 20))
	mgmt.WaitRequest(t, xdstest.ACK("v2"))
	bad := limit("edge", "user", "alice", 20)
	bad.Descriptors[0].RateLimit.Unit = 99
	mgmt.Set(t, node, "v3", bad)
	mgmt.WaitRequest(t, xdstest.NACK)
	// The server sends v3 again; its NACK waits for the backoff.
	blockUntilSleeping(t, clock)
	mgmt.Set(t, node, "v4", limit("edge", "user", "alice", 20))
	clock.Advance(xds.DefaultBackoffMax)
	mgmt.WaitRequest(t, xdstest.ACK("v4"))
	if v, _ := src.Version(); v != "v4" {
		t.Errorf("version %q, want v4", v)
	}

	ev := rec.Events()
	if len(ev) != 2 {
		t.Fatalf("%d events, want 2 (v1, v2; not the NACKed v3, not v4 which holds v2's rules): %+v", len(ev), ev)
	}
	subject := regexp.MustCompile(`^(v\d) sha256:([0-9a-f]{64})$`)
	var hashes []string
	for i, v := range []string{"v1", "v2"} {
		e := ev[i]
		m := subject.FindStringSubmatch(e.Subject)
		if m == nil || m[1] != v {
			t.Fatalf("event %d subject %q, want %q sha256:<hex>", i, e.Subject, v)
		}
		hashes = append(hashes, m[2])
		if e.Kind != audit.KindReload || e.Node != "node-a:1" || !strings.Contains(e.Reason, mgmt.Addr) {
			t.Errorf("event %d = %+v, want kind reload, node node-a:1, a reason naming %s", i, e, mgmt.Addr)
		}
	}
	if hashes[0] == hashes[1] {
		t.Errorf("hashes %v: want v1 ≠ v2", hashes)
	}
	want := []audit.Change{
		{What: "edge.user_alice: global.requests_per_unit", Old: "10", New: "20"},
		{What: "edge.user_alice: global.burst", Old: "10", New: "20"},
	}
	if diff := cmp.Diff(want, ev[1].Changes); diff != "" {
		t.Errorf("v2 changes: -want +got\n%s", diff)
	}
}
