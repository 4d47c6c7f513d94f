#!/usr/bin/env bash
# Load benchmark: the no-op RLS (the machine's ceiling), sluice on the memory
# backend and sluice on Redis, each under the spread, hot and envoy request
# mixes, plus the hot key over its limit. Prints a markdown table of medians
# and the "Speed" goals on stdout; progress goes to stderr.
#
# Everything runs on 127.0.0.1: binaries are built into a temporary directory,
# redis-server and the servers are started here and killed on exit (only the
# PIDs this script started). Method and columns: docs/benchmarks.md.
#
# Environment:
#   BENCH_DURATION       measured duration of each run         (default 10s)
#   BENCH_RUNS           runs of each cell; medians             (default 3)
#   BENCH_WARMUP         unmeasured warmup of each run          (default 1s)
#   BENCH_C              concurrent callers                     (default 64)
#   BENCH_CONNS          gRPC connections                       (default 4)
#   BENCH_REDIS_TIMEOUT  --redis-timeout of the Redis rows      (default 100ms)
#   BENCH_GOGC, BENCH_GOMEMLIMIT
#                        GOGC and GOMEMLIMIT of every server    (default off, 512MiB;
#                        set both empty for Go's defaults)
#   BENCH_RESULTS        also keep the raw JSON lines in this file
#   RLS_*                read by `rls serve` like its flags
set -Eeuo pipefail

duration=${BENCH_DURATION:-10s}
runs=${BENCH_RUNS:-3}
warmup=${BENCH_WARMUP:-1s}
callers=${BENCH_C:-64}
conns=${BENCH_CONNS:-4}
# On a few shared cores, CPU queueing alone passes the 10ms production
# deadline and the node would answer from its memory fallback, which would
# flatter the Redis rows.
redis_timeout=${BENCH_REDIS_TIMEOUT:-100ms}
# Same GC pacing for every server: with Go's defaults a server's GC runs
# every time its heap doubles, so the no-op (a tiny heap) collects far more
# often than sluice holding buckets, and the ceiling would sit below sluice.
gc_env=()
if [ -n "${BENCH_GOGC-off}" ]; then gc_env+=("GOGC=${BENCH_GOGC-off}"); fi
if [ -n "${BENCH_GOMEMLIMIT-512MiB}" ]; then gc_env+=("GOMEMLIMIT=${BENCH_GOMEMLIMIT-512MiB}"); fi

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sluice-bench.XXXXXX")
results="$tmp/results.jsonl"
: >"$results"
pids=()

# cleanup, forget, stop, wait_serving, field.
# shellcheck source=scripts/lib.sh
source "$root/scripts/lib.sh"
trap cleanup EXIT
trap 'echo "bench: failed at line $LINENO" >&2' ERR
trap 'exit 130' INT TERM

log() { echo "bench: $*" >&2; }

# failed BACKEND MIX TAG REASON: record a run that could not happen.
failed() {
	local reason
	reason=$(printf '%s' "$4" | tr -d '"\\' | tr '\n' ' ')
	printf '{"backend":"%s","mix":"%s","tag":"%s","failed":"%s"}\n' "$1" "$2" "$3" "$reason" >>"$results"
	log "$1 $2 ${3:+($3) }n/a: $reason"
}

loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown; }

# --- build -----------------------------------------------------------------
log "building rls and rlsbench into $tmp"
(cd "$root" && go build -o "$tmp/rls" ./cmd/rls && go build -o "$tmp/rlsbench" ./cmd/rlsbench)

# --- rules: limits high enough that answers are OK, except the over-limit key.
# In a directory of their own: rls serve reloads on any change in the rules'
# directory, and the logs written next to them would keep it reloading.
mkdir "$tmp/rules"
cat >"$tmp/rules/rules.yaml" <<'EOF'
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 1000000
      burst: 1000000
      local: {unit: second, requests_per_unit: 1000000, burst: 1000000}
  # The over-limit hot key: 10 tokens per second for a key asked thousands
  # of times per second, so nearly every answer is OVER_LIMIT.
  - key: remote_address
    value: 10.0.0.2
    rate_limit: {unit: second, requests_per_unit: 10, burst: 10}
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 1000000, burst: 1000000}
  - key: route
    descriptors:
      - key: user_id
        rate_limit: {unit: second, requests_per_unit: 1000000, burst: 1000000}
EOF

# --- redis-server on a free loopback port -----------------------------------
redis_port=""
redis_reason=""
start_redis() {
	if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
		redis_reason="redis-server or redis-cli not installed (scripts/ensure-redis.sh installs them)"
		return 1
	fi
	local port pid
	for _ in 1 2 3 4 5 6 7 8 9 10; do
		port=$((20000 + RANDOM % 40000))
		redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
			--dir "$tmp" --protected-mode yes >"$tmp/redis.log" 2>&1 &
		pid=$!
		pids+=("$pid")
		for _ in $(seq 50); do
			if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = "PONG" ]; then
				redis_port=$port
				return 0
			fi
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		stop "$pid" # port taken, or too slow: try another port
	done
	redis_reason="redis-server did not start: $(tail -n 1 "$tmp/redis.log" 2>/dev/null)"
	return 1
}
if start_redis; then
	log "redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$redis_port"
else
	log "Redis rows are n/a: $redis_reason"
fi

# --- the no-op RLS: one process for every run (it keeps no state) ------------
env "${gc_env[@]}" "$tmp/rlsbench" -noop -listen 127.0.0.1:0 2>"$tmp/noop.log" &
noop_pid=$!
pids+=("$noop_pid")
noop_line=$(wait_serving "$tmp/noop.log" "$noop_pid") || {
	cat "$tmp/noop.log" >&2
	log "the no-op server did not start"
	exit 1
}
noop_addr=$(field "$noop_line" grpc_addr)

# load BACKEND MIX TAG ADDR PID [rlsbench flags]: one measured run.
load() {
	local backend=$1 mix=$2 tag=$3 addr=$4 pid=$5 out
	shift 5
	if out=$("$tmp/rlsbench" -addr "$addr" -c "$callers" -conns "$conns" -d "$duration" \
		-warmup "$warmup" -mix "$mix" -backend "$backend" -tag "$tag" -server-pid "$pid" \
		"$@" 2>"$tmp/rlsbench.err"); then
		echo "$out" >>"$results"
		log "$backend $mix ${tag:+($tag) }$(sed -n 's/.*"qps":\([0-9.]*\).*"p99_ms":\([0-9.]*\).*/\1 QPS, p99 \2 ms/p' <<<"$out")"
	else
		failed "$backend" "$mix" "$tag" "rlsbench: $(tail -n 1 "$tmp/rlsbench.err")"
	fi
}

# sluice BACKEND MIX TAG [rlsbench flags] -- [rls serve flags]: one run
# against a fresh server (empty buckets, its own heap); its warnings
# (fallback, Redis errors) are shown.
sluice() {
	local backend=$1 mix=$2 tag=$3 slog="$tmp/rls.log" pid line why
	shift 3
	local bench=()
	while [ $# -gt 0 ] && [ "$1" != "--" ]; do
		bench+=("$1")
		shift
	done
	if [ $# -gt 0 ]; then shift; fi
	if [ "$backend" = redis ]; then
		if [ -z "$redis_port" ]; then
			failed "$backend" "$mix" "$tag" "$redis_reason"
			return 0
		fi
		redis-cli -h 127.0.0.1 -p "$redis_port" flushall >/dev/null
		bench+=(-redis "127.0.0.1:$redis_port")
		set -- --redis "redis://127.0.0.1:$redis_port/0" --redis-timeout "$redis_timeout" "$@"
	fi
	env "${gc_env[@]}" "$tmp/rls" serve --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
		--log-format text --config "$tmp/rules/rules.yaml" "$@" 2>"$slog" &
	pid=$!
	pids+=("$pid")
	if ! line=$(wait_serving "$slog" "$pid") || [ "$(field "$line" backend)" != "$backend" ]; then
		why=$(grep -m 1 -E 'level=(ERROR|WARN)|rls:' "$slog" || tail -n 1 "$slog" || true)
		local rc=0
		kill "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || rc=$?
		forget "$pid"
		failed "$backend" "$mix" "$tag" "rls serve did not serve (exit $rc): ${why:-no output}"
		return 0
	fi
	load "$backend" "$mix" "$tag" "$(field "$line" grpc_addr)" "$pid" \
		-metrics "http://$(field "$line" http_addr)/metrics" "${bench[@]}"
	if grep -q -E 'level=(WARN|ERROR)' "$slog"; then
		log "$backend $mix server warnings (first 3):"
		grep -m 3 -E 'level=(WARN|ERROR)' "$slog" >&2 || true
	fi
	stop "$pid"
}

# same_qps MIX: the no-op paced (-rate) at the QPS the Redis run of MIX just
# reached: the baseline of CPU per request at equal throughput.
same_qps() {
	local qps
	qps=$(tail -n 1 "$results" | sed -n 's/^{"backend":"redis","mix":"'"$1"'",.*"qps":\([0-9.]*\),.*/\1/p')
	if [ -n "$qps" ]; then
		load noop "$1" "at the Redis QPS" "$noop_addr" "$noop_pid" -rate "$qps"
	fi
}

# --- the matrix: runs interleaved, so drift hits every backend alike --------
log "load average before: $(loadavg) (other work on the machine skews every row)"
for run in $(seq "$runs"); do
	log "run $run/$runs: $duration each, c=$callers, conns=$conns"
	for mix in spread hot envoy; do
		load noop "$mix" "" "$noop_addr" "$noop_pid"
	done
	for backend in memory redis; do
		for mix in spread hot envoy; do
			sluice "$backend" "$mix" ""
			if [ "$backend" = redis ]; then same_qps "$mix"; fi
		done
		sluice "$backend" hot over-limit -hot-value 10.0.0.2
	done
done
log "load average after: $(loadavg)"

if [ -n "${BENCH_RESULTS:-}" ]; then
	cp "$results" "$BENCH_RESULTS"
fi

# --- report -----------------------------------------------------------------
model=$(sed -n 's/^model name[[:space:]]*: //p;T;q' /proc/cpuinfo 2>/dev/null || true)
echo "Machine: $(nproc) CPUs (${model:-unknown model}), $(go version | cut -d' ' -f3-4)${redis_port:+, redis $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')}."
echo "Load: closed loop, c=$callers callers over $conns gRPC connections, $duration measured after $warmup warmup, median of $runs run(s); Redis rows with --redis-timeout $redis_timeout; servers with ${gc_env[*]:-the default GC}."
echo
"$tmp/rlsbench" -report "$results"
