package redis

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"syscall"

	goredis "github.com/redis/go-redis/v9"
)

// ErrScript reports that token_bucket.lua failed in Redis or sent a reply
// this package cannot read.
var ErrScript = errors.New("token_bucket.lua failed")

// ErrConnection reports that Redis could not be reached or is not serving:
// refused or broken connections, a closed client, a cluster that is down,
// loading or failing over.
var ErrConnection = errors.New("redis unavailable")

// ErrOOM reports that Redis refused a write for lack of memory (an OOM
// error: maxmemory reached with maxmemory-policy noeviction, or keys
// without a TTL filling a volatile-* policy).
var ErrOOM = errors.New("redis out of memory")

// ErrNoPerm reports that Redis' ACL denied a command to the connection's
// user: the script call itself (NOPERM) or a command the script runs.
var ErrNoPerm = errors.New("redis ACL denies a command")

// ErrAbandoned reports that Hit's caller gave up (its context ended) before
// the decision came back: not a failure of Redis. The error also wraps the
// context's error.
var ErrAbandoned = errors.New("caller gave up")

// Error kinds returned by ErrorKind, the values of the kind label of
// ratelimit_redis_errors_total.
const (
	// KindTimeout: the deadline passed (errors.Is context.DeadlineExceeded).
	KindTimeout = "timeout"
	// KindConnection: Redis unreachable or not serving (ErrConnection).
	KindConnection = "connection"
	// KindScript: the script failed or replied oddly (ErrScript).
	KindScript = "script"
	// KindOOM: Redis refused a write for lack of memory (ErrOOM).
	KindOOM = "oom"
	// KindNoPerm: Redis' ACL denied a command (ErrNoPerm).
	KindNoPerm = "noperm"
	// KindOther: anything else, a caller's cancellation included.
	KindOther = "other"
)

// ErrorKinds returns every kind ErrorKind returns.
func ErrorKinds() []string {
	return []string{KindTimeout, KindConnection, KindScript, KindOOM, KindNoPerm, KindOther}
}

// errClosed fails Hit after Close, and the requests Close found queued.
var errClosed = fmt.Errorf("backend/redis: limiter closed: %w", ErrConnection)

// errAbandoned answers the queued parts of a caller that gave up; nobody
// reads it.
var errAbandoned = fmt.Errorf("backend/redis: %w", ErrAbandoned)

// errNotLocal wraps the error of a script call that reached a cluster
// master which does not serve one of its buckets (the client's slot map was
// stale): the script failed before writing anything, and Hit goes again
// slot by slot.
var errNotLocal = errors.New("a bucket is not on this master")

// isNotLocal reports Redis' refusal of a script that touches a key of a slot
// the node does not serve ("Script attempted to access a non local key in a
// cluster node", Redis 6 and 7).
func isNotLocal(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && strings.Contains(re.Error(), "non local key")
}

// ErrorKind classifies an error returned by Limiter.Hit (or Ping) for
// metrics: KindTimeout when it wraps context.DeadlineExceeded, KindOOM for
// ErrOOM, KindNoPerm for ErrNoPerm, KindScript for ErrScript,
// KindConnection for ErrConnection, KindOther for anything else (including
// a caller's cancellation), and "" for nil. An error wrapping ErrAbandoned is
// no Redis failure and is not meant to be counted as one.
func ErrorKind(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, context.DeadlineExceeded):
		return KindTimeout
	case errors.Is(err, ErrOOM):
		return KindOOM
	case errors.Is(err, ErrNoPerm):
		return KindNoPerm
	case errors.Is(err, ErrScript):
		return KindScript
	case errors.Is(err, ErrConnection):
		return KindConnection
	default:
		return KindOther
	}
}

// classify wraps err, returned by a Redis call made under callCtx, with the
// sentinel that says what went wrong. Socket deadlines set from the context
// surface as net timeouts, so a passed deadline wins over the error's form.
func classify(callCtx context.Context, op string, err error) error {
	ctxErr := callCtx.Err()
	switch {
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return fmt.Errorf("backend/redis: %s: %w", op, err)
	case errors.Is(ctxErr, context.DeadlineExceeded) || isTimeout(err):
		return fmt.Errorf("backend/redis: %s: %w: %w", op, context.DeadlineExceeded, err)
	case ctxErr != nil:
		return fmt.Errorf("backend/redis: %s: %w: %w", op, ctxErr, err)
	case isOOM(err):
		return fmt.Errorf("backend/redis: %s: %w: %w", op, ErrOOM, err)
	case isNoPerm(err):
		return fmt.Errorf("backend/redis: %s: %w: %w", op, ErrNoPerm, err)
	case isScriptError(err):
		return fmt.Errorf("backend/redis: %s: %w: %w", op, ErrScript, err)
	case isUnavailable(err):
		return fmt.Errorf("backend/redis: %s: %w: %w", op, ErrConnection, err)
	default:
		return fmt.Errorf("backend/redis: %s: %w", op, err)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, goredis.ErrPoolTimeout) ||
		(errors.As(err, &ne) && ne.Timeout())
}

// isOOM reports Redis' refusal of a write for lack of memory, sent for the
// script call or for a write inside it ("OOM command not allowed when used
// memory > 'maxmemory'", Redis 6 and 7).
func isOOM(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && (goredis.HasErrorPrefix(err, "OOM") || strings.Contains(re.Error(), "OOM command not allowed"))
}

// isNoPerm reports an ACL denial: of the command sent (NOPERM), or of a
// command a script runs ("The user executing the script can't run this
// command or subcommand", Redis 7).
func isNoPerm(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && (goredis.HasErrorPrefix(err, "NOPERM") ||
		strings.Contains(re.Error(), "NOPERM") ||
		strings.Contains(re.Error(), "user executing the script can't run"))
}

// isScriptError reports an error reply raised while running a script (a Lua
// runtime error, a missing script after reload, a wrong-type key).
func isScriptError(err error) bool {
	var re goredis.Error
	if !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return goredis.HasErrorPrefix(err, "NOSCRIPT") ||
		goredis.HasErrorPrefix(err, "WRONGTYPE") ||
		strings.Contains(msg, "script")
}

func isUnavailable(err error) bool {
	if goredis.IsClusterDownError(err) || goredis.IsLoadingError(err) ||
		goredis.IsReadOnlyError(err) || goredis.IsTryAgainError(err) ||
		goredis.IsMasterDownError(err) || goredis.HasErrorPrefix(err, "MOVED") ||
		goredis.HasErrorPrefix(err, "ASK") {
		return true
	}
	var re goredis.Error
	if errors.As(err, &re) {
		return false // any other error reply came from a serving Redis
	}
	var ne net.Error
	return errors.Is(err, goredis.ErrClosed) || errors.Is(err, goredis.ErrPoolExhausted) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EPIPE) || errors.As(err, &ne)
}
