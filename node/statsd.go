package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/statsd"
)

// Statsd are the flags that send envoyproxy/ratelimit's statsd counters,
// read from the node's metrics: off while Addr is empty.
type Statsd struct {
	Addr     string        // statsd host:port (UDP)
	Interval time.Duration // between two sends
}

func (s Statsd) validate() error {
	if s.Addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(s.Addr); err != nil {
		return fmt.Errorf("--statsd-addr %q: want host:port: %w", s.Addr, err)
	}
	if s.Interval <= 0 {
		return fmt.Errorf("--statsd-interval must be positive, not %v", s.Interval)
	}
	return nil
}

// startStatsd sends reg's counters to --statsd-addr until stop, which
// sends once more (the drain's decisions too) and waits for it. Without
// --statsd-addr it does nothing.
func startStatsd(s Statsd, reg prometheus.Gatherer, log *slog.Logger) (stop func()) {
	if s.Addr == "" {
		return func() {}
	}
	sender := statsd.New(statsd.Options{Addr: s.Addr, Interval: s.Interval, Gatherer: reg, Log: log})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		sender.Run(ctx)
	}()
	log.Info("sending statsd counters", "statsd_addr", s.Addr, "interval", s.Interval)
	return func() { cancel(); <-done }
}
