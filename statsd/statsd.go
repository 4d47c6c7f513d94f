// Package statsd sends envoyproxy/ratelimit's statsd counters, with its
// names, for deployments that monitor the rate limiter through statsd (a
// statsd_exporter, as Envoy Gateway's users do):
//
//	ratelimit.service.rate_limit.<rule>.total_hits
//	ratelimit.service.rate_limit.<rule>.within_limit
//	ratelimit.service.rate_limit.<rule>.near_limit
//	ratelimit.service.rate_limit.<rule>.over_limit
//	ratelimit.service.rate_limit.<rule>.shadow_mode
//	ratelimit.service.config_load_success
//	ratelimit.service.config_load_error
//
// where <rule> is the rule label of ratelimit_decisions_total (the domain,
// then the descriptor path, as the peer's stat key). The counters are read
// from the node's Prometheus registry once per interval and their increases
// sent over UDP: the request path does not know statsd exists, and pays
// nothing for it.
//
// A descriptor counts 1 in total_hits, whatever its hits_addend (the peer
// adds hits_addend). As in the peer, near_limit decisions also count in
// within_limit, and shadow_mode ones also in over_limit.
package statsd

import (
	"context"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/cactus/go-statsd-client/v5/statsd"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// DefaultInterval is how often counters are sent by default: the peer's
// STATS_FLUSH_INTERVAL default.
const DefaultInterval = 10 * time.Second

// prefix starts every name, as the peer's stats scope.
const prefix = "ratelimit.service"

// The Prometheus counters read, and their labels.
const (
	decisionsName   = "ratelimit_decisions_total"
	configLoadsName = "ratelimit_config_loads_total"
)

// suffixes are the statsd counters a decision of each result (the result
// label of ratelimit_decisions_total) adds to, besides total_hits.
var suffixes = map[string][]string{
	"ok":          {"within_limit"},
	"near_limit":  {"near_limit", "within_limit"},
	"over_limit":  {"over_limit"},
	"shadow_mode": {"shadow_mode", "over_limit"},
}

// Options configure a Sender.
type Options struct {
	Addr     string              // statsd host:port (UDP)
	Interval time.Duration       // between two sends; 0: DefaultInterval
	Gatherer prometheus.Gatherer // the node's registry
	Log      *slog.Logger
}

// Sender sends the increases of the registry's counters to statsd.
type Sender struct {
	opts   Options
	client statsd.Statter    // nil until a Send resolves Addr
	last   map[string]uint64 // statsd name → counter value last sent
}

// New returns a Sender to opts.Addr. It sends nothing until Send or Run,
// and resolves Addr then: a statsd server that cannot be found yet never
// stops the node, its counters wait for the next Send.
func New(opts Options) *Sender {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Sender{opts: opts, last: map[string]uint64{}}
}

// Run sends every interval until ctx is done, then sends once more and
// closes the sender.
func (s *Sender) Run(ctx context.Context) {
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := s.Send(); err != nil {
				s.opts.Log.Warn("statsd: last send failed", "addr", s.opts.Addr, "err", err)
			}
			if s.client != nil {
				_ = s.client.Close()
			}
			return
		case <-t.C:
			if err := s.Send(); err != nil {
				s.opts.Log.Warn("statsd: send failed", "addr", s.opts.Addr, "err", err)
			}
		}
	}
}

// Send reads the counters and sends what grew since the last Send. A
// counter whose send failed is sent again, with what it gained since, by
// the next Send.
func (s *Sender) Send() error {
	if s.client == nil {
		// One datagram per counter, sent at once: the client runs no
		// goroutine of its own.
		c, err := statsd.NewClientWithConfig(&statsd.ClientConfig{Address: s.opts.Addr, Prefix: prefix})
		if err != nil {
			return err
		}
		s.client = c
	}
	// A registry that fails to gather some metric still returns the
	// others: they are sent, the error reported, and what is missing kept
	// (not sent again whole next time).
	families, firstErr := s.opts.Gatherer.Gather()
	cur := counts(families)
	if firstErr != nil {
		for name, v := range s.last {
			if _, ok := cur[name]; !ok {
				cur[name] = v
			}
		}
	}
	for name, v := range cur {
		last := s.last[name]
		d := v - last
		if v < last { // the series was deleted and made again
			d = v
		}
		if d == 0 {
			continue
		}
		if err := s.client.Inc(name, int64(d), 1); err != nil {
			if firstErr == nil {
				firstErr = err
			}
			cur[name] = last
		}
	}
	s.last = cur // names gone from the registry are forgotten
	return firstErr
}

// counts sums the registry's counters into statsd names (without the
// prefix).
func counts(families []*dto.MetricFamily) map[string]uint64 {
	out := map[string]uint64{}
	for _, f := range families {
		switch f.GetName() {
		case decisionsName:
			for _, m := range f.GetMetric() {
				v := uint64(m.GetCounter().GetValue())
				rule, result := label(m, "rule"), label(m, "result")
				base := "rate_limit." + sanitize(rule) + "."
				out[base+"total_hits"] += v
				for _, suffix := range suffixes[result] {
					out[base+suffix] += v
				}
			}
		case configLoadsName:
			for _, m := range f.GetMetric() {
				out["config_load_"+label(m, "result")] += uint64(m.GetCounter().GetValue())
			}
		}
	}
	return out
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// ipv4 matches a dotted IPv4 address in a name.
var ipv4 = regexp.MustCompile(`\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{1,3}`)

// sanitize makes a rule label a statsd name as the peer does (its
// SanitizeStatName): ':' and '|' become '_', and so do the dots of an IPv4
// address (remote_address_10_0_0_1), which would split the name. '@' and
// control characters, which would end the name or the line, become '_' too:
// a rule label may carry a request's values (detailed_metric,
// value_to_metric).
func sanitize(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == ':' || r == '|' || r == '@' || r < 0x20 || r == 0x7f {
			return '_'
		}
		return r
	}, s)
	return ipv4.ReplaceAllStringFunc(s, func(ip string) string { return strings.ReplaceAll(ip, ".", "_") })
}
