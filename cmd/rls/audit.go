package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/audit/redisaudit"
	redisbackend "github.com/sluice-rls/sluice/backend/redis"
	"github.com/sluice-rls/sluice/cmd/rls/flags"
	"github.com/sluice-rls/sluice/node"
	"github.com/sluice-rls/sluice/override"
)

// auditError is an rls audit that could not read the trail (Redis
// unreachable, a bad URL): exit 2, as a usage error.
type auditError struct{ err error }

func (e auditError) Error() string { return e.err.Error() }
func (e auditError) Unwrap() error { return e.err }

const auditUsage = `usage: rls audit --redis URL [flags]

Prints the audit trail that rls serve --redis keeps in a Redis stream (rule
reloads and xDS updates, runtime overrides, adaptive triggers and restores),
newest first, one event per line: time, kind, node, author, reason, subject,
then every change as what "old" → "new". --redis takes the URL forms of rls
serve --redis.
Exit status: 0, or 2 on an error.

`

// auditCmd prints the newest events of the audit stream.
func auditCmd(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("audit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("redis", getenv("RLS_REDIS"), "Redis URL, as rls serve --redis (default: $RLS_REDIS)")
	ca := fs.String("redis-ca", getenv("RLS_REDIS_CA"), "CA bundle (PEM) to verify Redis' TLS certificate (default: $RLS_REDIS_CA, else the system roots)")
	stream := fs.String("stream", redisaudit.DefaultStream, "key of the audit stream (rls serve --audit-stream)")
	count := fs.Int("count", 20, "most events printed (0: all the stream holds)")
	var since time.Duration
	flags.DurationVar(fs, &since, "since", 0, "only events of the last `duration`, e.g. 1h or 1d (0: all)")
	kind := fs.String("kind", "", "only events of this kind: "+strings.Join(audit.Kinds(), ", ")+", "+redisaudit.KindInvalid+" (entries that do not decode), or a pattern matching some, such as override.* (default: all)")
	asJSON := fs.Bool("json", false, "print one JSON object per event")
	timeout := fs.Duration("timeout", 5*time.Second, "deadline of the whole read")
	fs.Usage = func() {
		fmt.Fprint(stderr, auditUsage)
		fs.PrintDefaults()
	}
	if err := flags.ParseInterspersed(fs, args); errors.Is(err, flag.ErrHelp) {
		return nil
	} else if err != nil {
		return errUsage
	}
	switch {
	case fs.NArg() > 0:
		fmt.Fprintf(stderr, "rls audit: no arguments expected, got %q\n", fs.Args())
		return errUsage
	case *url == "":
		fmt.Fprintln(stderr, "rls audit: --redis is required")
		return errUsage
	case *count < 0 || since < 0 || *timeout <= 0:
		fmt.Fprintln(stderr, "rls audit: --count and --since must not be negative, --timeout must be positive")
		return errUsage
	}
	if err := checkKind(*kind); err != nil {
		fmt.Fprintln(stderr, "rls audit:", err)
		return errUsage
	}
	opts, err := redisbackend.ParseURL(*url, *timeout)
	if err != nil {
		return auditError{fmt.Errorf("--redis: %w", err)}
	}
	if *ca != "" {
		if err := node.TrustCA(opts, *ca); err != nil {
			return auditError{err}
		}
	}
	client := goredis.NewUniversalClient(opts)
	defer client.Close()
	q := redisaudit.Query{Stream: *stream, Count: *count, Kind: *kind}
	if since > 0 {
		q.Since = clockwork.NewRealClock().Now().Add(-since)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	events, err := redisaudit.Read(ctx, client, q)
	if err != nil {
		return auditError{err}
	}
	for _, e := range events {
		if *asJSON {
			b, err := json.Marshal(e)
			if err != nil {
				return auditError{err}
			}
			fmt.Fprintf(stdout, "%s\n", b)
			continue
		}
		fmt.Fprintln(stdout, auditLine(e))
	}
	return nil
}

// checkKind refuses a --kind pattern that is malformed or matches no kind
// of event: a mistyped kind would otherwise print nothing and exit 0.
func checkKind(pattern string) error {
	if pattern == "" {
		return nil
	}
	kinds := append(audit.Kinds(), redisaudit.KindInvalid)
	for _, k := range kinds {
		ok, err := path.Match(pattern, k)
		if err != nil {
			return fmt.Errorf("--kind pattern %q: %w", pattern, err)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("--kind %q matches no kind of event (%s)", pattern, strings.Join(kinds, ", "))
}

// auditLine renders one event on one line: its time (UTC, milliseconds),
// kind, the fields that are set as key=value (quoted when they hold a space
// or a quote), then each change as what "old" → "new", separated by "; ".
func auditLine(e audit.Event) string {
	var b strings.Builder
	b.WriteString(e.Time.UTC().Format("2006-01-02T15:04:05.000Z07:00"))
	b.WriteByte(' ')
	b.WriteString(e.Kind)
	for _, f := range [...]struct{ k, v string }{{"node", e.Node}, {"author", e.Author}, {"reason", e.Reason}, {"subject", e.Subject}} {
		if f.v == "" {
			continue
		}
		b.WriteString(" " + f.k + "=")
		if strings.Contains(f.v, " ") {
			b.WriteString(strconv.Quote(f.v))
		} else {
			b.WriteString(override.Quote(f.v)) // quoted when it holds control characters or escapes
		}
	}
	for i, c := range e.Changes {
		if i == 0 {
			b.WriteString(" changes: ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(override.Quote(c.What) + " " + strconv.Quote(c.Old) + " → " + strconv.Quote(c.New))
	}
	return b.String()
}
