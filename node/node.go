package node

import (
	"context"
	"log/slog"
	"net"
)

// Node is one sluice node: built by New from its Options, served by Run.
type Node struct {
	opts  Options
	log   *slog.Logger
	ready chan struct{} // closed when the listeners serve; addrs set before
	addrs Addrs
}

// Addrs are the addresses a node listens on: what its listen options
// (host:port or unix:path, port 0 included) became.
type Addrs struct {
	GRPC, HTTP net.Addr
	Admin      net.Addr // nil: no admin listener
	Metrics    net.Addr // nil: no metrics listener of its own
}

// Ready is closed once Run serves on its listeners: Addrs is valid from
// then on. It is never closed when Run fails before.
func (n *Node) Ready() <-chan struct{} { return n.ready }

// Addrs returns the listeners' addresses, once Ready is closed.
func (n *Node) Addrs() Addrs {
	<-n.ready
	return n.addrs
}

// New checks opts and returns the node they describe; Run serves it.
func New(opts Options) (*Node, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Node{opts: opts, log: log, ready: make(chan struct{})}, nil
}

// Run serves the node until ctx is done, then drains (health
// NOT_SERVING, in-flight calls finish within DrainTimeout) and returns
// nil; an error if the node cannot start or a listener fails. Run a node
// once.
//
// Each step starts one part of the node, in the order a decision needs
// them; what a step starts is stopped by a deferred call, in reverse
// order, once the servers have drained.
func (n *Node) Run(ctx context.Context) error {
	st, log := n.opts, n.log
	adaptiveCfg, err := loadAdaptive(st)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	reg := newRegistry(st)
	defer startStatsd(st.Statsd, reg, log)()
	trail := newAuditTrail(st, log, reg)

	// The rules: from files, reloaded, or from xDS.
	rules, err := startRules(ctx, st, log, reg, trail)
	if err != nil {
		return err
	}
	defer rules.stop()

	// The limiting layers, and what the service needs beside them.
	traces, err := startTracing(ctx, st, log)
	if err != nil {
		return err
	}
	defer shutdownTracing(traces, st.DrainTimeout, log) // on early returns; a no-op after the drain's
	layers, err := newBackends(ctx, st, rules.store, log, reg, traces.Tracer())
	if err != nil {
		return err
	}
	defer layers.global.close()
	defer trail.startStream(layers.global.control)() // stopped before the client closes
	secrets, err := startEmergency(ctx, st.Emergency, log, reg)
	if err != nil {
		return err
	}
	ovr, err := startOverrides(ctx, st, layers.global.controlOpts, rules.store, trail, log, reg)
	if err != nil {
		return err
	}
	defer ovr.stop()
	stopAdaptive, err := startAdaptive(ctx, adaptiveCfg, st, layers.global.control, ovr.mgr, rules.store, trail, log, reg)
	if err != nil {
		return err
	}
	defer stopAdaptive()
	svc := newService(st, rules.store, ovr, layers, secrets, reg, traces)

	// The servers, the listeners, and serving until ctx is done.
	srvs, err := n.newServers(ctx, reg, svc, rules, layers.global, ovr, traces != nil)
	if err != nil {
		return err
	}
	lis, err := listen(st, log)
	if err != nil {
		srvs.grpc.srv.Stop() // its stream workers
		return err
	}
	return n.serve(ctx, srvs, lis, rules, layers.global, traces)
}
