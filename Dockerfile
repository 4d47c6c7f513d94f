# syntax=docker/dockerfile:1
#
# sluice's container image: a static rls binary on distroless, running as
# nonroot (uid 65532).
#
#   docker build -t sluice-rls/sluice .
#   docker run --rm -p 8080:8080 -p 8081:8081 sluice-rls/sluice
#
# /json and /debug/pprof/ are on the admin address, loopback inside the
# container (127.0.0.1:8082): not reachable through -p. To post to /json from
# the host: `docker run ... -p 127.0.0.1:8082:8082 sluice-rls/sluice serve
# --admin-addr :8082` (only on a machine you trust; see docs/operations.md).
#
# With no arguments it runs `rls serve` on the embedded example rules and the
# memory backend. Add flags after the image name (`serve --redis
# redis://redis:6379/0 --config /etc/sluice/rules`) or set RLS_<FLAG>
# variables (-e RLS_REDIS=...). The root filesystem can be read-only: sluice
# writes nothing to disk.

# Go 1.26, as go.mod requires.
FROM golang:1.26 AS build
WORKDIR /src
# Module downloads first: a layer that survives source-only changes.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The Makefile's build target, minus the -X version stamp (no .git in the
# build context): `rls version` reports the module version or "devel".
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/rls ./cmd/rls

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/rls /rls
# 8081: gRPC (RateLimitService v3, grpc.health.v1). 8080: HTTP (/healthcheck,
# /metrics, /rlconfig).
EXPOSE 8080 8081
USER nonroot:nonroot
ENTRYPOINT ["/rls"]
CMD ["serve"]
