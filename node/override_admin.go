package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	goredis "github.com/redis/go-redis/v9"

	"github.com/sluice-rls/sluice/override"
	"github.com/sluice-rls/sluice/override/redisstore"
	"github.com/sluice-rls/sluice/ruleset"
)

// maxOverrideBody bounds the JSON of one /overrides call.
const maxOverrideBody = 64 << 10

// overrides is serve's runtime-override machinery: the Manager the
// service reads, and what /overrides, /healthcheck, /rlconfig and the
// metrics show of it.
type overrides struct {
	mgr   *override.Manager
	rules *ruleset.Store
	auth  *adminAuth
	stop  func() // ends the Manager's run and closes the store
}

// startOverrides builds the override store (Redis with redisOpts, the
// global layer's client options; else this node's --override-file or
// memory), reads it once so that a restarted node applies its overrides
// from the first request, and runs the Manager until ctx is done; its
// stop waits for it.
func startOverrides(ctx context.Context, st Options, redisOpts *goredis.UniversalOptions, rules *ruleset.Store, trail auditTrail, log *slog.Logger, reg prometheus.Registerer) (*overrides, error) {
	auth, err := newAdminAuth(st.Overrides.AdminTokenFile, st.AdminTLSClientCA != "", log, reg)
	if err != nil {
		return nil, err
	}
	var store override.Store
	closeStore := func() {}
	if redisOpts != nil {
		// A client of its own, on the global layer's options (TLS, client
		// certificate, sockets): the subscription holds a connection for good.
		// controlOptions: off the request path, the Manager's deadlines.
		client := goredis.NewUniversalClient(redisOpts)
		store = redisstore.New(redisstore.Options{Client: client})
		closeStore = func() { _ = client.Close() }
	} else {
		fs, err := override.OpenFile(st.Overrides.File)
		if err != nil {
			return nil, err
		}
		store = fs
	}
	mgr := override.NewManager(override.ManagerOptions{
		Store:  store,
		Rules:  rules.Rules,
		Logger: log,
		Audit:  trail.rec,
		Node:   trail.node,
		Resync: st.Overrides.Resync,
		// Set refuses loosening overrides without an expiry within this.
		MaxLoosenExpiry: st.Overrides.MaxExpiry,
		// Timeout: override.DefaultTimeout, not --redis-timeout: these
		// calls are off the request path, and a busy Redis must not make
		// an operator's set fail.
	})
	if err := mgr.Load(ctx); err != nil {
		log.Warn("runtime overrides not read at start; retrying every --override-resync", "err", err)
	}
	o := &overrides{mgr: mgr, rules: rules, auth: auth}
	o.register(reg)
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		mgr.Run(runCtx)
	}()
	o.stop = func() {
		cancel()
		<-done
		closeStore()
	}
	return o, nil
}

// register adds ratelimit_overrides{kind}, ratelimit_override_malformed
// and ratelimit_override_store_healthy to reg.
func (o *overrides) register(reg prometheus.Registerer) {
	for _, k := range override.Kinds() {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "ratelimit_overrides",
			Help:        "Runtime overrides this node applies, by kind (scale, limit, block, allow, shadow).",
			ConstLabels: prometheus.Labels{"kind": string(k)},
		}, func() float64 { return float64(o.table().Count(k)) }))
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_override_malformed",
		Help: "Entries of the runtime-override store that are not valid overrides, as last read: skipped (the others apply); remove each with rls override rm ID.",
	}, func() float64 { return float64(len(o.mgr.Malformed())) }))
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "ratelimit_override_store_healthy",
		Help: "1 when the last read of the runtime-override store (Redis, or this node's file) succeeded; 0 while it fails and the node keeps the overrides it last read.",
	}, func() float64 {
		if ok, _, _ := o.mgr.Health(); ok {
			return 1
		}
		return 0
	}))
}

func (o *overrides) table() *override.Table { return o.mgr.Table(o.rules.Rules()) }

// healthLine is /healthcheck's line about overrides.
func (o *overrides) healthLine() string {
	n := len(o.table().Active())
	bad := ""
	if k := len(o.mgr.Malformed()); k > 0 {
		bad = fmt.Sprintf(", %d malformed skipped (rls override list)", k)
	}
	ok, since, err := o.mgr.Health()
	if ok {
		return fmt.Sprintf("overrides: %d active%s, store %s", n, bad, o.mgr.StoreName())
	}
	return fmt.Sprintf("overrides: %d active%s, store %s unreachable since %s (%v): applying the overrides last read",
		n, bad, o.mgr.StoreName(), since.UTC().Format(time.RFC3339), err)
}

// writeRLConfig appends the overrides to /rlconfig, which the public HTTP
// port serves unauthenticated: counts by kind only. Blocked values,
// authors and reasons stay on the admin port's authenticated /overrides.
func (o *overrides) writeRLConfig(w io.Writer) {
	t := o.table()
	var kinds []string
	for _, k := range override.Kinds() {
		if n := t.Count(k); n > 0 {
			kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		}
	}
	line := fmt.Sprintf("# overrides: %d active", len(t.Active()))
	if len(kinds) > 0 {
		line += " (" + strings.Join(kinds, ", ") + ")"
	}
	if n := len(t.Ignored()); n > 0 {
		line += fmt.Sprintf(", %d not applied to protected rules", n)
	}
	if n := len(o.mgr.Malformed()); n > 0 {
		line += fmt.Sprintf(", %d malformed skipped", n)
	}
	fmt.Fprintln(w, line+"; the list: rls override list (/overrides on the admin address, authenticated)")
}

// OverrideRequest is the JSON of POST /overrides.
type OverrideRequest struct {
	Domain string  `json:"domain"`
	Rule   string  `json:"rule"`
	Value  string  `json:"value"`
	Kind   string  `json:"kind"`
	Factor float64 `json:"factor"`
	Limit  string  `json:"limit"`
	Burst  uint32  `json:"burst"`
	Reason string  `json:"reason"`
	Note   string  `json:"note"`
	// ExpiresIn is a Go duration ("2h"); empty: never.
	ExpiresIn string `json:"expires_in"`
}

// OverrideList is the JSON of GET /overrides.
type OverrideList struct {
	Overrides  []override.Override `json:"overrides"`
	NotApplied []string            `json:"not_applied,omitempty"`
	// Malformed are stored entries that are not overrides: skipped.
	Malformed    []override.Malformed `json:"malformed,omitempty"`
	Store        string               `json:"store"`
	StoreHealthy bool                 `json:"store_healthy"`
	StoreError   string               `json:"store_error,omitempty"`
}

// mount serves /overrides on the admin mux: GET lists, POST sets, DELETE
// /overrides/{id} removes; every call authenticated. Without
// authentication configured it answers 404 saying how to turn it on.
func (o *overrides) mount(mux *http.ServeMux) {
	if !o.auth.enabled() {
		off := func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "/overrides is off: it needs authentication (--admin-token-file, or --tls-client-ca)", http.StatusNotFound)
		}
		mux.HandleFunc("/overrides", off)
		mux.HandleFunc("/overrides/", off)
		return
	}
	mux.HandleFunc("GET /overrides", o.authed(o.list))
	mux.HandleFunc("POST /overrides", o.authed(o.set))
	mux.HandleFunc("PUT /overrides", o.authed(o.set))
	mux.HandleFunc("DELETE /overrides/{id}", o.authed(o.remove))
}

// authed refuses unauthenticated calls with 401 before h sees them.
func (o *overrides) authed(h func(w http.ResponseWriter, r *http.Request, author string)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		author, err := o.auth.author(r)
		if err != nil {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		h(w, r, author)
	}
}

func (o *overrides) list(w http.ResponseWriter, r *http.Request, _ string) {
	t := o.table()
	ok, _, err := o.mgr.Health()
	out := OverrideList{Overrides: t.Active(), NotApplied: t.Ignored(), Malformed: o.mgr.Malformed(), Store: o.mgr.StoreName(), StoreHealthy: ok}
	if out.Overrides == nil {
		out.Overrides = []override.Override{}
	}
	if err != nil {
		out.StoreError = err.Error()
	}
	writeJSON(w, http.StatusOK, out)
}

func (o *overrides) set(w http.ResponseWriter, r *http.Request, author string) {
	var req OverrideRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxOverrideBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		http.Error(w, "override: "+err.Error(), http.StatusBadRequest)
		return
	}
	ov := override.Override{
		Domain: req.Domain, Rule: req.Rule, Value: req.Value, Kind: override.Kind(req.Kind),
		Factor: req.Factor, Limit: req.Limit, Burst: req.Burst, Reason: req.Reason, Note: req.Note,
	}
	if req.ExpiresIn != "" {
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 {
			http.Error(w, fmt.Sprintf("override: expires_in %q: want a positive duration such as 2h", req.ExpiresIn), http.StatusBadRequest)
			return
		}
		ov.Expires = o.mgr.Now().Add(d).UTC()
	}
	got, err := o.mgr.Set(r.Context(), ov, author)
	if err != nil {
		http.Error(w, "override: "+err.Error(), statusOf(err))
		return
	}
	writeJSON(w, http.StatusOK, got)
}

func (o *overrides) remove(w http.ResponseWriter, r *http.Request, author string) {
	got, err := o.mgr.Remove(r.Context(), r.PathValue("id"), author, r.URL.Query().Get("reason"))
	if err != nil {
		http.Error(w, "override: "+err.Error(), statusOf(err))
		return
	}
	writeJSON(w, http.StatusOK, got)
}

// statusOf maps a Manager error to an HTTP status: 403 for a protected
// rule, 404 for an unknown ID, 503 when the store failed, else 400.
func statusOf(err error) int {
	switch {
	case errors.Is(err, override.ErrProtected):
		return http.StatusForbidden
	case errors.Is(err, override.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, override.ErrStore):
		return http.StatusServiceUnavailable
	}
	return http.StatusBadRequest
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
