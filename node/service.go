package node

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/ruleset"
	"github.com/sluice-rls/sluice/service"
	"github.com/sluice-rls/sluice/tracing"
)

// newService builds the server that decides: the rules of store, the
// runtime overrides, the two layers, the emergency channel's secrets, and
// how it answers (st).
func newService(st Options, store *ruleset.Store, ovr *overrides, layers backends, secrets service.EmergencySecrets, reg prometheus.Registerer, traces *tracing.Provider) *service.Server {
	return service.New(service.Options{
		Rules:        store,
		Overrides:    ovr.mgr,
		Local:        layers.local,
		Global:       layers.global.limiter,
		Logger:       st.Logger,
		Metrics:      service.NewMetrics(reg),
		GrayKey:      st.GrayKey,
		EmergencyKey: st.Emergency.Key,
		Emergency:    secrets,
		Settings:     st.Settings,
		Tracer:       traces.Tracer(), // nil when off: no tracing cost
	})
}
