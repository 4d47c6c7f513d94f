# sluice — the two commands a new user needs are `make run` and `make test`.

GO        ?= go
GOFLAGS   ?=
# Every go command here builds with -trimpath, as `make build` and the image
# do: what it compiles does not depend on where the clone is, so a fresh
# clone reuses the build cache an earlier clone filled instead of compiling
# every package again (the go commands the tests run inherit it).
export GOFLAGS := $(strip $(GOFLAGS) -trimpath)
BIN       := bin/rls
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# `rls version` and ratelimit_build_info report these (cmd/rls/version.go).
LDFLAGS   := -s -w -X main.buildVersion=$(VERSION) -X main.buildCommit=$(COMMIT)

.PHONY: all build run test unit lint fuzz bench bench-micro clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/rls

# Runs the server on its embedded default: memory backend, example rules.
run:
	$(GO) run ./cmd/rls serve

# The whole suite, as CI runs it: installs redis-server and prometheus (with promtool) when missing, checks
# formatting and vet, then runs every test (unit, integration, fault) with -race.
# ./integration comes first so that it starts first: its tests mostly wait on processes
# and timed runs, which then overlap the other packages instead of following them.
test: lint
	./scripts/ensure-deps.sh
	RLS_REQUIRE_REDIS=1 RLS_REQUIRE_PROMTOOL=1 RLS_REQUIRE_PROMETHEUS=1 $(GO) test -race -tags integration -timeout 30m -count=1 ./integration ./...
	# The schema checks of envoy-examples/, the Helm chart's tests and the
	# workflow lint live in modules of their own, so their heavy dependencies
	# stay out of rls.
	cd envoy-examples/schema && $(GO) vet ./... && $(GO) test -count=1 ./...
	cd charts/sluice/test && $(GO) vet ./... && $(GO) test -count=1 ./...
	# actionlint on .github/workflows/*.yml (shellcheck on run: scripts when installed).
	cd .github/lint && $(GO) vet ./... && $(GO) test -count=1 ./...

# Unit tests only (no build tag, no required Redis): quick inner loop.
unit:
	$(GO) test -race ./...

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags integration ./...

fuzz:
	$(GO) test -run XXX -fuzz FuzzParse -fuzztime 30s ./descriptors
	$(GO) test -run XXX -fuzz FuzzBucketKey -fuzztime 30s ./descriptors

# Go micro-benchmarks of the hot path (matching, keys, memory buckets, handler).
bench-micro:
	$(GO) test -run XXX -bench . -benchmem ./descriptors ./backend/memory ./service

# Load benchmark: no-op vs memory vs Redis under three request mixes; prints a
# markdown table (docs/benchmarks.md). BENCH_DURATION=3s BENCH_RUNS=1 for a quick look.
bench:
	./scripts/bench.sh

clean:
	rm -rf bin
