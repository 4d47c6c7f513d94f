package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/audit/redisaudit"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
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
	rls := serveInProcess(t, noEnv, loopback("--config", dir, "--redis", url, "--audit-stream", "test:audit")...)
	rls.Addr()
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
			t.Fatalf("no reload in the stream; serve's log:\n%s", rls.Log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(ev.Subject) || ev.Node != thisNode() || !strings.HasPrefix(ev.Reason, "rule files changed") {
		t.Errorf("event %+v: want a SHA-256 subject, node %s, reason rule files changed", ev, thisNode())
	}
	want := []audit.Change{{What: "d.k_v*: levels[0].share_threshold", Old: "false", New: "true"}}
	if diff := cmp.Diff(want, ev.Changes); diff != "" {
		t.Errorf("changes: -want +got\n%s", diff)
	}
	out, _, err := rlsAudit("--redis", url, "--stream", "test:audit")
	wantLine := `reload node=` + thisNode() + ` reason="rule files changed: ` + dir + `" subject=` + ev.Subject + ` changes: d.k_v*: levels[0].share_threshold "false" → "true"`
	if err != nil || !strings.Contains(out, wantLine) {
		t.Errorf("rls audit: %v\n%s\nwant a line holding\n%s", err, out, wantLine)
	}
	if log := rls.Log.String(); !strings.Contains(log, `"msg":"audit"`) || !strings.Contains(log, `"subject":"`+ev.Subject+`"`) {
		t.Errorf("the log has no audit line for %s:\n%s", ev.Subject, log)
	}
	rls.StopCleanly()
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
		{"mistyped kind", []string{"--redis", "127.0.0.1:1", "--kind", "relaod"}, `--kind "relaod" matches no kind of event`},
		{"since in days", []string{"--redis", "127.0.0.1:1", "--since", "1d", "--timeout", "2s"}, "reading audit stream"},
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

// TestAuditThroughSentinel: the stream is written and read through a
// Sentinel URL (the master it names), as with serve --redis sentinel://.
func TestAuditThroughSentinel(t *testing.T) {
	master := redistest.Start(t)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Skip("redis-server not found") // redistest.Start already failed or skipped otherwise
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor mymaster 127.0.0.1 %d 1\n", port, dir, master.Port())
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	url := "sentinel://mymaster@127.0.0.1:" + strconv.Itoa(port) + "/0"

	opts, err := redisbackend.ParseURL(url, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	client := goredis.NewUniversalClient(opts)
	defer client.Close()
	for wait := time.Now().Add(10 * time.Second); client.Ping(context.Background()).Err() != nil; {
		if time.Now().After(wait) {
			t.Fatal("the sentinel never gave the master")
		}
		time.Sleep(20 * time.Millisecond)
	}
	w := redisaudit.New(redisaudit.Options{})
	w.Record(context.Background(), audit.Event{Time: time.Date(2026, 12, 2, 1, 0, 0, 0, time.UTC), Kind: audit.KindReload, Subject: "via-sentinel"})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx, client) }()
	defer func() { cancel(); <-done }()

	deadline := time.Now().Add(10 * time.Second)
	for {
		out, errOut, err := rlsAudit("--redis", url, "--timeout", "2s")
		if err == nil && strings.Contains(out, "reload subject=via-sentinel") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rls audit through the sentinel: %v, %q, %q", err, out, errOut)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n, err := master.Client().XLen(context.Background(), redisaudit.DefaultStream).Result(); err != nil || n != 1 {
		t.Errorf("the master holds %d entries (%v), want the one written through the sentinel", n, err)
	}
}

// thisNode is how a node in this process names itself in audit events:
// the host name and the process ID.
func thisNode() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
}
