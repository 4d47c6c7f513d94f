package node

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-rls/sluice/emergency"
	"github.com/sluice-rls/sluice/service"
)

// startEmergency opens --emergency-secret-file and re-reads it whenever it
// changes, until ctx is done. Nil when the channel is off. A file that
// cannot be read or parsed at start is an error: the channel an operator
// asked for does not silently start without its secrets.
func startEmergency(ctx context.Context, st Emergency, log *slog.Logger, reg prometheus.Registerer) (service.EmergencySecrets, error) {
	if st.Key == "" {
		return nil, nil
	}
	f, err := emergency.Open(st.SecretFile, emergency.Options{Logger: log, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("emergency channel: %w", err)
	}
	go func() {
		if err := f.Watch(ctx); err != nil {
			log.Error("the emergency secrets file is not watched: rotating a secret needs a restart", "err", err)
		}
	}()
	log.Info("emergency channel on", "key", st.Key, "secret_file", st.SecretFile, "secrets", f.Len())
	return f, nil
}
