# syntax=docker/dockerfile:1
#
# sluice's container image: a static rls binary on distroless, running as
# nonroot (uid:gid 65532:65532).
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

# Release builds pass the tag and commit (README.md, "Release"); without them
# `rls version` reports "devel" and "unknown" (the context has no .git).
#
#   docker build --build-arg VERSION=v1.2.3 --build-arg COMMIT=$(git rev-parse HEAD) .
ARG VERSION=devel
ARG COMMIT=unknown

# Base images are pinned by digest (the multi-platform index), so a rebuild
# of the same commit uses the same bases; the tag stays beside it for
# readers and for Renovate/Dependabot. To refresh, read the current index
# digest of the tag and replace the one after @sha256:
#
#   docker buildx imagetools inspect golang:1.26.8
#   docker buildx imagetools inspect gcr.io/distroless/static-debian12:nonroot
#
# (the "Digest:" line of the top-level index). Both digests below were taken
# without registry access, from public Dockerfiles that pin them (December
# 2026): golang's as pinned for golang:1.26.8 in several Dockerfiles,
# distroless's as pinned in over ten others. Check both with the commands
# above before a release.
#
# The Go version is go.mod's, exactly: the tag here, GOTOOLCHAIN below and the
# README say the same (envoy-examples/goversion_test.go fails when they
# disagree). golang images set GOTOOLCHAIN=local, which refuses a go.mod that
# asks for a newer patch than the image's. GOTOOLCHAIN=go<version> instead
# runs exactly that toolchain: the image's own when the digest holds it (no
# download), otherwise the go command fetches it from the module proxy and
# checks it against the checksum database. So an unchecked digest cannot build
# with another Go than go.mod's.
#
# The build stage runs on the builder's platform and cross-compiles for the
# target's (TARGETOS/TARGETARCH, set by BuildKit): a multi-arch build
# (docker buildx build --platform linux/amd64,linux/arm64) needs no emulation.
FROM --platform=$BUILDPLATFORM golang:1.26.8@sha256:0f063af2d465d8dcae54cce04278ada488b96f77b42449c8d071e47d016cc65a AS build
ARG TARGETOS
ARG TARGETARCH
ENV GOTOOLCHAIN=go1.26.8 GOOS=$TARGETOS GOARCH=$TARGETARCH
ARG VERSION
ARG COMMIT
WORKDIR /src
# Module downloads first: a layer that survives source-only changes.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The Makefile's build target, with the tag and commit of the build args.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.buildVersion=${VERSION} -X main.buildCommit=${COMMIT}" -o /out/rls ./cmd/rls

FROM gcr.io/distroless/static-debian12:nonroot@sha256:d093aa3e30dbadd3efe1310db061a14da60299baff8450a17fe0ccc514a16639
ARG VERSION
ARG COMMIT
LABEL org.opencontainers.image.source="https://github.com/sluice-rls/sluice" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${COMMIT}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.title="sluice" \
      org.opencontainers.image.description="Rate-limit service for Envoy (gRPC RateLimitService v3)"
COPY --from=build /out/rls /rls
# 8081: gRPC (RateLimitService v3, grpc.health.v1). 8080: HTTP (/healthcheck,
# /metrics, /rlconfig).
EXPOSE 8080 8081
# Numeric: a kubelet with runAsNonRoot and no runAsUser refuses a named user
# (it cannot check that "nonroot" is not root). 65532 is distroless's nonroot.
USER 65532:65532
ENTRYPOINT ["/rls"]
CMD ["serve"]
