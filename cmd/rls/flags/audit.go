package flags

import (
	"flag"

	"github.com/sluice-rls/sluice/audit/redisaudit"
	"github.com/sluice-rls/sluice/node"
)

// registerAudit registers the flags of Audit onto a.
func registerAudit(fs *flag.FlagSet, a *node.Audit) {
	fs.StringVar(&a.Stream, "audit-stream", redisaudit.DefaultStream, "with --redis: Redis stream that keeps the audit trail (rule reloads, overrides) for rls audit; empty: the log only")
	fs.Int64Var(&a.MaxLen, "audit-stream-max-len", redisaudit.DefaultMaxLen, "about how many events the audit stream keeps (MAXLEN ~): older ones are trimmed")
}
