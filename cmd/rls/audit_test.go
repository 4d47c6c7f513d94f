package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/audit/redisaudit"
	"github.com/sluice-rls/sluice/internal/redistest"
)

// rlsAudit runs `rls audit args...` in-process.
func rlsAudit(args ...string) (stdout, stderr string, err error) {
	var out, errOut bytes.Buffer
	err = run(context.Background(), append([]string{"audit"}, args...), &out, &errOut, noEnv)
	return out.String(), errOut.String(), err
}

// TestServeAuditsReloadsToRedis: serve with --redis records a reload that
// changes only share_threshold (logged as changed=0 before) in the log and
// in the Redis stream, where rls audit reads it back.
func TestServeAuditsReloadsToRedis(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr() + "/0"
	dir := t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	rules := "domain: d\ndescriptors:\n  - key: k\n    value: \"v*\"\n    SHARE\n    rate_limit: {unit: second, requests_per_unit: 10}\n"
	if err := os.WriteFile(file, []byte(strings.Replace(rules, "    SHARE\n", "", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var stderr lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"serve", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0", "--admin-addr", "",
			"--log-format", "json", "--config", dir, "--redis", url, "--audit-stream", "test:audit"}, &stderr, &stderr, noEnv)
	}()
	grpcAddr(t, &stderr)
	if err := os.WriteFile(file, []byte(strings.Replace(rules, "SHARE", "share_threshold: true", 1)), 0o644); err != nil {
		t.Fatal(err)
	}

	var ev audit.Event
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, errOut, err := rlsAudit("--redis", url, "--stream", "test:audit", "--kind", "reload", "--json")
		if err != nil {
			t.Fatalf("rls audit: %v\n%s", err, errOut)
		}
		if out != "" {
			if err := json.Unmarshal([]byte(out), &ev); err != nil {
				t.Fatalf("rls audit --json printed %q: %v", out, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no reload in the stream; serve's log:\n%s", stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(ev.Subject) || ev.Node != nodeName() || !strings.HasPrefix(ev.Reason, "rule files changed") {
		t.Errorf("event %+v: want a SHA-256 subject, node %s, reason rule files changed", ev, nodeName())
	}
	want := []audit.Change{{What: "d.k_v*: levels[0].share_threshold", Old: "false", New: "true"}}
	if diff := cmp.Diff(want, ev.Changes); diff != "" {
		t.Errorf("changes: -want +got\n%s", diff)
	}
	out, _, err := rlsAudit("--redis", url, "--stream", "test:audit")
	wantLine := `reload node=` + nodeName() + ` reason="rule files changed: ` + dir + `" subject=` + ev.Subject + ` changes: d.k_v*: levels[0].share_threshold "false" → "true"`
	if err != nil || !strings.Contains(out, wantLine) {
		t.Errorf("rls audit: %v\n%s\nwant a line holding\n%s", err, out, wantLine)
	}
	if log := stderr.String(); !strings.Contains(log, `"msg":"audit"`) || !strings.Contains(log, `"subject":"`+ev.Subject+`"`) {
		t.Errorf("the log has no audit line for %s:\n%s", ev.Subject, log)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serve returned %v after cancel, want nil", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop after cancel")
	}
}

func TestAuditCommandFilters(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client()
	w := redisaudit.New(redisaudit.Options{})
	at := time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC)
	for i, k := range []string{audit.KindReload, audit.KindOverrideSet, audit.KindOverrideExpire} {
		w.Record(context.Background(), audit.Event{Time: at.Add(time.Duration(i) * time.Second), Kind: k, Author: "alice", Subject: "s" + k})
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, c) }()
	deadline := time.Now().Add(10 * time.Second)
	for n, _ := c.XLen(ctx, redisaudit.DefaultStream).Result(); n < 3; n, _ = c.XLen(ctx, redisaudit.DefaultStream).Result() {
		if time.Now().After(deadline) {
			t.Fatal("the events never reached the stream")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	<-done

	url := "redis://" + srv.Addr()
	for _, tt := range []struct {
		args []string
		want []string // subjects, in order
	}{
		{nil, []string{"soverride.expire", "soverride.set", "sreload"}},
		{[]string{"--count", "1"}, []string{"soverride.expire"}},
		{[]string{"--kind", "override.*"}, []string{"soverride.expire", "soverride.set"}},
		{[]string{"--kind", "reload"}, []string{"sreload"}},
		{[]string{"--since", "1h"}, []string{"soverride.expire", "soverride.set", "sreload"}},
		{[]string{"--stream", "none"}, nil},
	} {
		out, errOut, err := rlsAudit(append([]string{"--redis", url}, tt.args...)...)
		if err != nil {
			t.Fatalf("rls audit %q: %v\n%s", tt.args, err, errOut)
		}
		var got []string
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if m := regexp.MustCompile(`subject=(\S+)`).FindStringSubmatch(line); m != nil {
				got = append(got, m[1])
			}
		}
		if !cmp.Equal(tt.want, got) {
			t.Errorf("rls audit %q: subjects %v, want %v; printed\n%s", tt.args, got, tt.want, out)
		}
	}
	if out, _, _ := rlsAudit("--redis", url, "--count", "1"); out != "2026-12-02T01:00:02.000Z override.expire author=alice subject=soverride.expire\n" {
		t.Errorf("rls audit printed %q", out)
	}
}

func TestAuditCommandErrors(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no redis", nil, "--redis is required"},
		{"stray argument", []string{"--redis", "127.0.0.1:1", "x"}, "no arguments"},
		{"negative count", []string{"--redis", "127.0.0.1:1", "--count", "-1"}, "must not be negative"},
		{"bad url", []string{"--redis", "redis://user:s3cret@host:notaport"}, "--redis"},
		{"closed port", []string{"--redis", "127.0.0.1:1", "--timeout", "2s"}, "reading audit stream"},
		{"bad kind", []string{"--redis", "127.0.0.1:1", "--kind", "["}, "kind pattern"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, err := rlsAudit(tt.args...)
			if err == nil {
				t.Fatalf("rls audit %q succeeded", tt.args)
			}
			if code := exitCode(err); code != 2 {
				t.Errorf("rls audit %q exits %d, want 2", tt.args, code)
			}
			if got := errOut + err.Error(); !strings.Contains(got, tt.want) || strings.Contains(got, "s3cret") {
				t.Errorf("rls audit %q: %q; want it to say %q, never the password", tt.args, got, tt.want)
			}
		})
	}
}
