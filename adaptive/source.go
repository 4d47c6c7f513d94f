package adaptive

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
)

// Source evaluates a signal's query to one number.
type Source interface {
	// Query returns the query's value now. A result that is not one
	// number (empty, several series) is an error; NaN is returned as is.
	Query(ctx context.Context, query string) (float64, error)
}

// ErrEmpty is wrapped by Query's error when the query matched no series.
var ErrEmpty = errors.New("empty result")

// Prometheus is a Source reading a Prometheus-compatible HTTP API with
// client_golang's API client.
type Prometheus struct {
	api     promv1.API
	timeout time.Duration
}

// NewPrometheus returns a Source querying the API at address (a base URL,
// e.g. http://prometheus:9090) with client, each query's evaluation
// bounded by timeout (0: the server's default).
func NewPrometheus(address string, client *http.Client, timeout time.Duration) (*Prometheus, error) {
	if client == nil {
		client = &http.Client{}
	}
	c, err := api.NewClient(api.Config{Address: address, Client: client})
	if err != nil {
		return nil, fmt.Errorf("prometheus %q: %w", address, err)
	}
	return &Prometheus{api: promv1.NewAPI(c), timeout: timeout}, nil
}

// Query evaluates query at the server's current time.
func (p *Prometheus) Query(ctx context.Context, query string) (float64, error) {
	var opts []promv1.Option
	if p.timeout > 0 {
		opts = append(opts, promv1.WithTimeout(p.timeout))
	}
	v, _, _, err := p.api.Query(ctx, query, time.Time{}, opts...)
	if err != nil {
		return 0, err
	}
	switch v := v.(type) {
	case *model.Scalar:
		return float64(v.Value), nil
	case model.Vector:
		switch len(v) {
		case 0:
			return 0, ErrEmpty
		case 1:
			return float64(v[0].Value), nil
		}
		return 0, fmt.Errorf("%d series: aggregate the query to one (sum, max, ...)", len(v))
	}
	return 0, fmt.Errorf("result of type %s: want a scalar or an instant vector", v.Type())
}
