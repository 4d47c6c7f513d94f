package statsd_test

import (
	"context"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/statsd"
)

// listen is a statsd server: a UDP socket on a free loopback port.
func listen(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// receive reads datagrams until want lines arrived (or 5 s passed), and
// returns the lines sorted.
func receive(t *testing.T, c *net.UDPConn, want int) []string {
	t.Helper()
	var lines []string
	buf := make([]byte, 64*1024)
	deadline := time.Now().Add(5 * time.Second)
	for len(lines) < want {
		if err := c.SetReadDeadline(deadline); err != nil {
			t.Fatal(err)
		}
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("after %d lines %q: %v", len(lines), lines, err)
		}
		lines = append(lines, strings.Fields(string(buf[:n]))...)
	}
	slices.Sort(lines)
	return lines
}

// TestSendPeerNames: the node's counters reach a statsd server under the
// peer's names, and a second Send carries only what grew since.
func TestSendPeerNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_decisions_total"}, []string{"domain", "rule", "layer", "result", "gray"})
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_config_loads_total"}, []string{"result"})
	reg.MustRegister(decisions, loads)
	decisions.WithLabelValues("edge", "edge.user", "local", "ok", "false").Add(3)
	decisions.WithLabelValues("edge", "edge.user", "global", "ok", "true").Add(1)
	decisions.WithLabelValues("edge", "edge.user", "global", "near_limit", "false").Add(2)
	decisions.WithLabelValues("edge", "edge.user", "global", "over_limit", "false").Add(5)
	// A value carrying statsd's separators cannot forge a line.
	decisions.WithLabelValues("edge", "edge.ip_1:2|c\nx", "local", "shadow_mode", "false").Add(1)
	// The peer writes an IPv4 address with '_' (SanitizeStatName).
	decisions.WithLabelValues("edge", "edge.remote_address_10.0.0.1", "global", "ok", "false").Add(1)
	loads.WithLabelValues("success").Add(1)

	srv := listen(t)
	s := statsd.New(statsd.Options{Addr: srv.LocalAddr().String(), Gatherer: reg})
	if err := s.Send(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"ratelimit.service.config_load_success:1|c",
		"ratelimit.service.rate_limit.edge.ip_1_2_c_x.over_limit:1|c",
		"ratelimit.service.rate_limit.edge.ip_1_2_c_x.shadow_mode:1|c",
		"ratelimit.service.rate_limit.edge.ip_1_2_c_x.total_hits:1|c",
		"ratelimit.service.rate_limit.edge.remote_address_10_0_0_1.total_hits:1|c",
		"ratelimit.service.rate_limit.edge.remote_address_10_0_0_1.within_limit:1|c",
		"ratelimit.service.rate_limit.edge.user.near_limit:2|c",
		"ratelimit.service.rate_limit.edge.user.over_limit:5|c",
		"ratelimit.service.rate_limit.edge.user.total_hits:11|c",
		"ratelimit.service.rate_limit.edge.user.within_limit:6|c",
	}
	if got := receive(t, srv, len(want)); !slices.Equal(got, want) {
		t.Errorf("first send:\n got %q\nwant %q", got, want)
	}

	decisions.WithLabelValues("edge", "edge.user", "local", "ok", "false").Add(4)
	loads.WithLabelValues("error").Add(1)
	if err := s.Send(); err != nil {
		t.Fatal(err)
	}
	want = []string{
		"ratelimit.service.config_load_error:1|c",
		"ratelimit.service.rate_limit.edge.user.total_hits:4|c",
		"ratelimit.service.rate_limit.edge.user.within_limit:4|c",
	}
	if got := receive(t, srv, len(want)); !slices.Equal(got, want) {
		t.Errorf("second send, the increases only:\n got %q\nwant %q", got, want)
	}
}

// TestRunSendsWhenStopped: Run sends once more when its context ends (the
// node's drain), however long the interval, and then returns.
func TestRunSendsWhenStopped(t *testing.T) {
	reg := prometheus.NewRegistry()
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_config_loads_total"}, []string{"result"})
	reg.MustRegister(loads)
	loads.WithLabelValues("success").Add(2)
	srv := listen(t)
	s := statsd.New(statsd.Options{Addr: srv.LocalAddr().String(), Interval: time.Hour, Gatherer: reg})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx)
	}()
	cancel()
	<-done
	if got, want := receive(t, srv, 1), []string{"ratelimit.service.config_load_success:2|c"}; !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestUnresolvedServerFailsTheSend: a statsd host that cannot be resolved
// fails a Send (Run logs it and tries again at the next interval), not New:
// the node starts without its statsd server.
func TestUnresolvedServerFailsTheSend(t *testing.T) {
	reg := prometheus.NewRegistry()
	loads := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_config_loads_total"}, []string{"result"})
	reg.MustRegister(loads)
	loads.WithLabelValues("success").Add(1)
	s := statsd.New(statsd.Options{Addr: "statsd.invalid:8125", Gatherer: reg})
	if err := s.Send(); err == nil {
		t.Fatal("Send to statsd.invalid succeeded")
	}
}
