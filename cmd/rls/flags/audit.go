package flags

import (
	"flag"
	"fmt"

	"github.com/sluice-rls/sluice/audit/redisaudit"
)

// Audit are the flags of the audit trail's Redis stream. Every audit event
// also goes to the log; with --redis it goes to the stream too, unless
// Stream is empty.
type Audit struct {
	Stream string // key of the stream; "": no stream
	MaxLen int64  // about how many events the stream keeps
}

func (a *Audit) register(fs *flag.FlagSet) {
	fs.StringVar(&a.Stream, "audit-stream", redisaudit.DefaultStream, "with --redis: Redis stream that keeps the audit trail (rule reloads, overrides) for rls audit; empty: the log only")
	fs.Int64Var(&a.MaxLen, "audit-stream-max-len", redisaudit.DefaultMaxLen, "about how many events the audit stream keeps (MAXLEN ~): older ones are trimmed")
}

func (a Audit) validate() error {
	if a.MaxLen <= 0 {
		return fmt.Errorf("--audit-stream-max-len must be positive, not %d", a.MaxLen)
	}
	return nil
}
