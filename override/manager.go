package override

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/sluice-rls/sluice/audit"
	"github.com/sluice-rls/sluice/descriptors"
)

// Defaults of ManagerOptions.
const (
	// DefaultResync is how often a Manager re-reads its store even without
	// a change notification: the bound on propagation when a notification
	// is lost (a Redis reconnect drops pub/sub messages).
	DefaultResync = 500 * time.Millisecond
	// DefaultTimeout bounds each store call.
	DefaultTimeout = time.Second
	// DefaultMaxLoosenExpiry is how far ahead a loosening override (see
	// Loosening) may expire: a bypass forgotten over a weekend is a door
	// left open.
	DefaultMaxLoosenExpiry = 24 * time.Hour
)

// ErrNotFound is returned by Remove for an unknown ID.
var ErrNotFound = errors.New("no such override")

// ErrStore is wrapped by Set's and Remove's errors when the store failed
// (nothing was changed, or the change is unknown).
var ErrStore = errors.New("override store")

// ManagerOptions configures a Manager. Store and Rules are required.
type ManagerOptions struct {
	Store Store
	// Rules returns the current rule set, to validate and compile against.
	Rules func() *descriptors.Config
	Clock clockwork.Clock // nil: the real clock
	// Logger gets store failures and ignored overrides; nil discards.
	Logger *slog.Logger
	// Audit records every set, remove, expiry, and every change this node
	// applies; nil records nothing.
	Audit audit.Recorder
	// Node names this node in audit events.
	Node string
	// Resync is the longest time between two reads of the store
	// (default DefaultResync).
	Resync time.Duration
	// Timeout bounds each store call (default DefaultTimeout).
	Timeout time.Duration
	// MaxLoosenExpiry is the furthest expiry Set accepts for a loosening
	// override, which must have one (default DefaultMaxLoosenExpiry).
	MaxLoosenExpiry time.Duration
}

// state is what a Manager applies: the overrides last read, and their
// table for one rule set.
type state struct {
	list      []Override // as last read, expired ones dropped
	malformed []Malformed
	gen       int64 // the highest store generation applied
	cfg       *descriptors.Config
	table     *Table // nil: no active override
}

// Manager keeps the current overrides of this node: it reads them from the
// Store at start, on each change notification and every Resync, drops
// expired ones on time on its clock (without a write), and compiles them
// against the current rules. Table is what the service calls per request:
// one atomic load, and a compile only on the first request after a rule
// reload. While the store is unreachable it keeps applying the overrides
// it last read (Health says so).
type Manager struct {
	opts ManagerOptions
	log  *slog.Logger
	cur  atomic.Pointer[state]
	mu   sync.Mutex // serializes applying a new list or rule set

	kick chan struct{} // a change notification, coalesced

	healthMu  sync.Mutex
	healthErr error     // the last store read's error; nil: healthy
	errSince  time.Time // when reads started failing
	lastRead  time.Time
}

// NewManager returns a Manager holding no overrides; Load or Run reads the
// store.
func NewManager(opts ManagerOptions) *Manager {
	if opts.Clock == nil {
		opts.Clock = clockwork.NewRealClock()
	}
	if opts.Resync <= 0 {
		opts.Resync = DefaultResync
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxLoosenExpiry <= 0 {
		opts.MaxLoosenExpiry = DefaultMaxLoosenExpiry
	}
	m := &Manager{opts: opts, log: opts.Logger, kick: make(chan struct{}, 1)}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	m.cur.Store(&state{})
	return m
}

// Now returns the time on the Manager's clock.
func (m *Manager) Now() time.Time { return m.opts.Clock.Now() }

// StoreName names the store, for logs and /healthcheck.
func (m *Manager) StoreName() string { return m.opts.Store.Name() }

// Table returns the compiled overrides for the rule set cfg (nil: none).
// The common case is one atomic load and a pointer comparison; after a
// rule reload the first caller compiles the table for the new set.
func (m *Manager) Table(cfg *descriptors.Config) *Table {
	st := m.cur.Load()
	if st.cfg == cfg {
		return st.table
	}
	return m.rebuild(cfg)
}

// rebuild compiles the current list against cfg and swaps it in. A
// request still holding the rule set a reload replaced gets a table of
// its own, not kept: swapping it in would make the old and new rule sets'
// requests recompile in turn until the old ones drain.
func (m *Manager) rebuild(cfg *descriptors.Config) *Table {
	if cfg != m.opts.Rules() {
		return Compile(cfg, m.cur.Load().list, m.Now())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	st := m.cur.Load()
	if st.cfg == cfg {
		return st.table
	}
	next := &state{list: st.list, malformed: st.malformed, gen: st.gen, cfg: cfg, table: Compile(cfg, st.list, m.Now())}
	m.logIgnored(st.table, next.table)
	m.cur.Store(next)
	return next.table
}

// List returns the overrides this node applies (active ones), sorted by ID.
func (m *Manager) List() []Override {
	return m.Table(m.opts.Rules()).Active()
}

// Malformed returns the stored entries the last read skipped because they
// are not valid overrides, sorted by ID.
func (m *Manager) Malformed() []Malformed { return m.cur.Load().malformed }

// Health reports whether the last read of the store succeeded; when not,
// the error and since when reads have failed.
func (m *Manager) Health() (ok bool, since time.Time, err error) {
	m.healthMu.Lock()
	defer m.healthMu.Unlock()
	return m.healthErr == nil, m.errSince, m.healthErr
}

// Load reads the store once and applies what it holds. Run calls it; call
// it before serving so that a restarted node applies the stored overrides
// from its first request.
func (m *Manager) Load(ctx context.Context) error {
	lctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	l, err := m.opts.Store.List(lctx)
	cancel()
	m.noteRead(err)
	if err != nil {
		cur := m.cur.Load()
		m.apply(ctx, cur.list, cur.malformed, cur.gen, false) // drop what expired meanwhile
		return fmt.Errorf("reading overrides from %s: %w", m.opts.Store.Name(), err)
	}
	if cur := m.cur.Load(); l.Generation < cur.gen {
		if restored, err := m.restore(ctx, l.Generation, cur); err != nil || !restored {
			// Not restored: another node restored first (read what it
			// wrote), or Redis failed (try at the next read).
			lctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
			l, err = m.opts.Store.List(lctx)
			cancel()
			if err != nil {
				return fmt.Errorf("reading overrides from %s: %w", m.opts.Store.Name(), err)
			}
		} else {
			l = Listing{Overrides: cur.list, Malformed: cur.malformed, Generation: cur.gen}
		}
	}
	list, malformed := sortOut(l)
	m.apply(ctx, list, malformed, l.Generation, true)
	return nil
}

// restore writes the table this node applies (cur) back to a store whose
// generation (stored) is lower than the one cur was read at: a Redis
// restarted empty or flushed, or rolled back to an older snapshot. The
// store writes it only if no node wrote a newer generation meanwhile (the
// highest generation wins), so a node holding a stale table (one that
// missed changes while cut off) never overwrites a newer one, and of two
// nodes restoring at once the one that saw more changes does. Logged and
// recorded as override.restore.
func (m *Manager) restore(ctx context.Context, stored int64, cur *state) (bool, error) {
	r, ok := m.opts.Store.(Restorer)
	if !ok {
		return false, nil
	}
	rctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	restored, err := r.Restore(rctx, cur.gen, cur.list)
	cancel()
	if err != nil {
		m.log.Warn("override store lost its overrides; restoring them failed, retrying at the next read", "store", m.opts.Store.Name(),
			"store_generation", stored, "generation", cur.gen, "err", err)
		return false, err
	}
	if !restored {
		return false, nil
	}
	m.log.Warn("override store lost its overrides (a Redis restart or flush): restored the ones this node applied", "store", m.opts.Store.Name(),
		"store_generation", stored, "generation", cur.gen, "overrides", len(cur.list))
	changes := make([]audit.Change, 0, len(cur.list))
	for i := range cur.list {
		changes = append(changes, audit.Change{What: cur.list[i].Scope(), Old: "", New: describe(&cur.list[i])})
	}
	m.record(ctx, audit.Event{Kind: audit.KindOverrideRestore, Time: m.Now().UTC(), Author: "sluice", Subject: m.opts.Store.Name(),
		Reason: fmt.Sprintf("store lost its overrides: generation %d, this node applied %d", stored, cur.gen), Changes: changes})
	return true, nil
}

// sortOut splits a listing into the valid overrides and the malformed
// entries, those that decode but fail Validate included.
func sortOut(l Listing) ([]Override, []Malformed) {
	malformed := slices.Clone(l.Malformed)
	var list []Override
	for _, o := range l.Overrides {
		if err := Validate(o, nil); err != nil {
			malformed = append(malformed, Malformed{ID: o.ID, Err: strings.ReplaceAll(err.Error(), "\n", "; ")})
			continue
		}
		list = append(list, o)
	}
	slices.SortFunc(malformed, func(a, b Malformed) int { return strings.Compare(a.ID, b.ID) })
	return list, malformed
}

func (m *Manager) noteRead(err error) {
	m.healthMu.Lock()
	defer m.healthMu.Unlock()
	now := m.Now()
	switch {
	case err == nil:
		if m.healthErr != nil {
			m.log.Info("override store reachable again", "store", m.opts.Store.Name())
		}
		m.healthErr, m.lastRead = nil, now
	case m.healthErr == nil:
		m.healthErr, m.errSince = err, now
		m.log.Warn("override store unreachable: applying the overrides last read", "store", m.opts.Store.Name(), "err", err)
	default:
		m.healthErr = err
	}
}

// Run reads the store now, on every change notification and every Resync,
// and drops expired overrides at their expiry, until ctx is done.
func (m *Manager) Run(ctx context.Context) {
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		if err := m.opts.Store.Watch(watchCtx, m.changed); err != nil && watchCtx.Err() == nil {
			m.log.Warn("override change notifications stopped; re-reading every resync", "err", err)
		}
	}()
	defer func() {
		stopWatch()
		<-watchDone
	}()
	_ = m.Load(ctx) // logged by noteRead
	for {
		wait := m.opts.Resync
		if exp := m.cur.Load().table.NextExpiry(); !exp.IsZero() {
			wait = min(wait, max(exp.Sub(m.Now()), 0))
		}
		timer := m.opts.Clock.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-m.kick:
			timer.Stop()
		case <-timer.Chan():
		}
		_ = m.Load(ctx)
	}
}

// changed is the store's notification: wake Run without blocking.
func (m *Manager) changed() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// apply makes list (as read from the store) current: expired overrides
// dropped (and deleted from the store, the node that deletes one recording
// its expiry; not while the store is unreachable), every difference from the previous list recorded as
// applied, the table compiled against the current rules.
func (m *Manager) apply(ctx context.Context, list []Override, malformed []Malformed, gen int64, reachable bool) {
	now := m.Now()
	var live, expired []Override
	for _, o := range list {
		if o.Active(now) {
			live = append(live, o)
		} else {
			expired = append(expired, o)
		}
	}
	m.mu.Lock()
	prev := m.cur.Load()
	cfg := m.opts.Rules()
	next := &state{list: live, malformed: malformed, gen: max(gen, prev.gen), cfg: cfg, table: Compile(cfg, live, now)}
	m.cur.Store(next)
	m.logIgnored(prev.table, next.table)
	m.mu.Unlock()
	m.logMalformed(prev.malformed, malformed)
	m.recordApplied(ctx, prev.list, live, now)
	for _, o := range expired {
		if !reachable {
			break
		}
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.opts.Timeout)
		removed, err := m.opts.Store.Delete(dctx, o.ID)
		cancel()
		if err == nil && removed {
			m.record(ctx, audit.Event{Kind: audit.KindOverrideExpire, Time: o.Expires, Author: o.Author, Reason: o.Reason, Subject: o.ID,
				Changes: []audit.Change{{What: o.Scope(), Old: describe(&o), New: ""}}})
		}
	}
}

// recordApplied records one applied event per override added, changed or
// gone between prev and next.
func (m *Manager) recordApplied(ctx context.Context, prev, next []Override, now time.Time) {
	old := make(map[string]*Override, len(prev))
	for i := range prev {
		old[prev[i].ID] = &prev[i]
	}
	for i := range next {
		o := &next[i]
		p := old[o.ID]
		delete(old, o.ID)
		if p != nil && *p == *o {
			continue
		}
		m.record(ctx, audit.Event{Kind: audit.KindApplied, Time: now, Author: o.Author, Reason: o.Reason, Subject: o.ID,
			Changes: []audit.Change{{What: o.Scope(), Old: describe(p), New: describe(o)}}})
	}
	for id, p := range old {
		m.record(ctx, audit.Event{Kind: audit.KindApplied, Time: now, Author: p.Author, Reason: p.Reason, Subject: id,
			Changes: []audit.Change{{What: p.Scope(), Old: describe(p), New: ""}}})
	}
}

// describe is an override's effect and expiry for audit changes; "" for nil.
func describe(o *Override) string {
	if o == nil {
		return ""
	}
	s := o.Effect()
	if !o.Expires.IsZero() {
		s += " until " + o.Expires.UTC().Format(time.RFC3339)
	}
	return s
}

func (m *Manager) record(ctx context.Context, e audit.Event) {
	if m.opts.Audit == nil {
		return
	}
	e.Node = m.opts.Node
	m.opts.Audit.Record(ctx, e)
}

// logMalformed warns once about each malformed entry next has and prev
// had not.
func (m *Manager) logMalformed(prev, next []Malformed) {
	for _, b := range next {
		if !slices.Contains(prev, b) {
			m.log.Warn("malformed override entry skipped: the others apply; remove it with rls override rm", "id", b.ID, "store", m.opts.Store.Name(), "err", b.Err)
		}
	}
}

// logIgnored logs the protected-rule refusals that next has and prev had not.
func (m *Manager) logIgnored(prev, next *Table) {
	seen := make(map[string]bool)
	for _, s := range prev.Ignored() {
		seen[s] = true
	}
	for _, s := range next.Ignored() {
		if !seen[s] {
			m.log.Warn("override not applied to a protected rule", "why", s)
		}
	}
}

// Set validates o against the current rules, fills in its ID, Author
// (author: as authenticated, never from the request) and Created, stores
// it and applies it on this node at once. It returns the stored override.
// Errors wrapping ErrProtected refuse to loosen a protected rule.
func (m *Manager) Set(ctx context.Context, o Override, author string) (Override, error) {
	o.Author = author
	o.Created = m.Now().UTC()
	o.ID = NewID(o)
	if !o.Expires.IsZero() && !o.Expires.After(o.Created) {
		return Override{}, fmt.Errorf("expiry %s is not in the future", o.Expires.Format(time.RFC3339))
	}
	cfg := m.opts.Rules()
	if err := Validate(o, cfg); err != nil {
		return Override{}, err
	}
	if Loosening(o, cfg) {
		maxExp := m.opts.MaxLoosenExpiry
		switch {
		case o.Expires.IsZero():
			return Override{}, fmt.Errorf("%s loosens the limits: it needs an expiry, at most %v ahead (--override-max-expiry)", o.Effect(), maxExp)
		case o.Expires.Sub(o.Created) > maxExp:
			return Override{}, fmt.Errorf("expiry %s is %v ahead: %s loosens the limits and may expire at most %v ahead (--override-max-expiry)",
				o.Expires.UTC().Format(time.RFC3339), o.Expires.Sub(o.Created).Round(time.Second), o.Effect(), maxExp)
		}
	}
	sctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	l, err := m.listForChange(sctx)
	if err != nil {
		return Override{}, fmt.Errorf("%w %s: reading: %w", ErrStore, m.opts.Store.Name(), err)
	}
	list := l.Overrides
	var old *Override
	for i := range list {
		if list[i].ID == o.ID && list[i].Active(m.Now()) {
			old = &list[i]
		}
	}
	if err := m.opts.Store.Put(sctx, o); err != nil {
		return Override{}, fmt.Errorf("%w %s: storing: %w", ErrStore, m.opts.Store.Name(), err)
	}
	m.record(ctx, audit.Event{Kind: audit.KindOverrideSet, Time: o.Created, Author: author, Reason: o.Reason, Subject: o.ID,
		Changes: []audit.Change{{What: o.Scope(), Old: describe(old), New: describe(&o)}}})
	_ = m.Load(ctx)
	return o, nil
}

// listForChange reads the store before Set or Remove changes it. A store
// that lost its overrides gets them back first (Load restores them): a
// change written on the lost store would start its generation anew, below
// this node's, and the restore would then overwrite it.
func (m *Manager) listForChange(ctx context.Context) (Listing, error) {
	l, err := m.opts.Store.List(ctx)
	if err != nil || l.Generation >= m.cur.Load().gen {
		return l, err
	}
	if err := m.Load(ctx); err != nil {
		return Listing{}, err
	}
	return m.opts.Store.List(ctx)
}

// Remove deletes the override id from the store and applies that on this
// node at once; ErrNotFound when there is none. author is recorded.
func (m *Manager) Remove(ctx context.Context, id, author, reason string) (Override, error) {
	sctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	l, err := m.listForChange(sctx)
	if err != nil {
		return Override{}, fmt.Errorf("%w %s: reading: %w", ErrStore, m.opts.Store.Name(), err)
	}
	var old *Override
	for i := range l.Overrides {
		if l.Overrides[i].ID == id {
			old = &l.Overrides[i]
		}
	}
	// A malformed entry is removed by its field name: it has no scope to
	// describe, its error says what it was.
	var bad *Malformed
	for i := range l.Malformed {
		if l.Malformed[i].ID == id {
			bad = &l.Malformed[i]
		}
	}
	removed, err := m.opts.Store.Delete(sctx, id)
	if err != nil {
		return Override{}, fmt.Errorf("%w %s: removing: %w", ErrStore, m.opts.Store.Name(), err)
	}
	if !removed || old == nil && bad == nil {
		return Override{}, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	if old == nil {
		old = &Override{ID: id, Reason: "malformed entry: " + bad.Err}
		m.record(ctx, audit.Event{Kind: audit.KindOverrideRemove, Time: m.Now().UTC(), Author: author, Reason: reason, Subject: id,
			Changes: []audit.Change{{What: "malformed entry", Old: bad.Err, New: ""}}})
	} else {
		m.record(ctx, audit.Event{Kind: audit.KindOverrideRemove, Time: m.Now().UTC(), Author: author, Reason: reason, Subject: id,
			Changes: []audit.Change{{What: old.Scope(), Old: describe(old), New: ""}}})
	}
	_ = m.Load(ctx)
	return *old, nil
}
