package service

import (
	"fmt"
	"io"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// maxJSONBody bounds a /json request body.
const maxJSONBody = 1 << 20

// JSONOptions configures the /json handler.
type JSONOptions struct {
	// AllowNegativeHits accepts descriptors with is_negative_hits, which
	// return tokens to a bucket. Off, such requests get 403: anyone who
	// reaches /json could otherwise refill any bucket.
	AllowNegativeHits bool
}

// JSONHandler serves envoyproxy/ratelimit's /json endpoint: POST a
// RateLimitRequest in proto-JSON; the answer is the RateLimitResponse in
// proto-JSON with status 200 (OK) or 429 (OVER_LIMIT), 400 for a malformed
// or oversized request, 403 for is_negative_hits unless opts allow it.
// Response headers the decision adds are also set as HTTP headers.
func (s *Server) JSONHandler(opts JSONOptions) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST a RateLimitRequest in proto-JSON", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSONBody))
		if err != nil {
			http.Error(w, "reading request: "+err.Error(), http.StatusBadRequest)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			http.Error(w, "invalid RateLimitRequest: "+err.Error(), http.StatusBadRequest)
			return
		}
		if !opts.AllowNegativeHits {
			for i, d := range req.GetDescriptors() {
				if d.GetIsNegativeHits() {
					http.Error(w, fmt.Sprintf("descriptor %d: is_negative_hits is refused on /json (rls serve --json-negative-hits allows it)", i), http.StatusForbidden)
					return
				}
			}
		}
		resp, err := s.ShouldRateLimit(r.Context(), &req)
		if err != nil {
			http.Error(w, status.Convert(err).Message(), http.StatusBadRequest)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, "encoding response: "+err.Error(), http.StatusInternalServerError)
			return
		}
		for _, h := range resp.GetResponseHeadersToAdd() {
			w.Header().Add(h.GetKey(), h.GetValue())
		}
		w.Header().Set("Content-Type", "application/json")
		code := http.StatusOK
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			code = http.StatusTooManyRequests
		}
		w.WriteHeader(code)
		_, _ = w.Write(out)
	})
}
