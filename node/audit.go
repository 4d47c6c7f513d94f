package node

import (
	"context"
	"log/slog"
	"os"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/audit/redisaudit"
)

// nodeName names this node in audit events as the Redis node registry
// does: host name and process ID.
func nodeName() string {
	host, _ := os.Hostname()
	return host + ":" + strconv.Itoa(os.Getpid())
}

// auditTrail is where serve records audit events: the log always, and the
// Redis stream of --audit-stream with --redis.
type auditTrail struct {
	rec    audit.Recorder
	node   string
	stream *redisaudit.Writer // nil: no stream
}

// newAuditTrail builds the recorders of the audit trail. The stream's
// writer queues events until startStream gives it the Redis client.
func newAuditTrail(st Options, log *slog.Logger, reg prometheus.Registerer) auditTrail {
	t := auditTrail{node: nodeName()}
	multi := audit.Multi{audit.Log{Logger: log}}
	if st.Redis != "" && st.Audit.Stream != "" {
		t.stream = redisaudit.New(redisaudit.Options{
			Stream:  st.Audit.Stream,
			MaxLen:  st.Audit.MaxLen,
			Timeout: max(st.RedisTimeout, redisaudit.DefaultTimeout),
			Log:     log,
			Metrics: redisaudit.NewMetrics(reg),
		})
		multi = append(multi, t.stream)
	}
	t.rec = multi
	return t
}

// startStream writes the stream's queued and future events through client
// until stop, which waits for the writer to end (at most about two write
// timeouts); call it before closing client. No stream: a no-op.
func (t auditTrail) startStream(client redisaudit.Adder) (stop func()) {
	if t.stream == nil || client == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		t.stream.Run(ctx, client)
	}()
	return func() {
		cancel()
		<-done
	}
}
