#!/usr/bin/env bash
# Standing shares side by side: the no-op RLS, sluice on its memory global
# layer, and sluice on Redis with every global rule leased, then leased with
# share 0.5, each under the envoy and spread mixes, the runs of one round
# back to back. Prints one JSON line per run (rlsbench's) on stdout, and a
# summary of medians on stderr. Method: docs/benchmarks.md.
#
# Environment: BENCH_DURATION (5s), BENCH_RUNS (3), BENCH_WARMUP (1s),
# BENCH_C (64), BENCH_CONNS (4).
set -Eeuo pipefail

duration=${BENCH_DURATION:-5s}
runs=${BENCH_RUNS:-3}
warmup=${BENCH_WARMUP:-1s}
callers=${BENCH_C:-64}
conns=${BENCH_CONNS:-4}
gc_env=(GOGC=off GOMEMLIMIT=512MiB)

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sluice-share-bench.XXXXXX")
pids=()
# shellcheck source=scripts/lib.sh
source "$root/scripts/lib.sh"
trap cleanup EXIT
log() { echo "share-bench: $*" >&2; }

(cd "$root" && go build -o "$tmp/rls" ./cmd/rls && go build -o "$tmp/rlsbench" ./cmd/rlsbench)

# rules DIR SHARE: bench.sh's rules (no over-limit key), every global rule
# leased, with SHARE (", share: 0.5" or "") on each.
rules() {
	mkdir -p "$tmp/$1"
	cat >"$tmp/$1/rules.yaml" <<R
domain: edge
descriptors:
  - key: remote_address
    rate_limit:
      {unit: second, requests_per_unit: 1000000, burst: 1000000, consistency: leased$2,
       local: {unit: second, requests_per_unit: 1000000, burst: 1000000}}
  - key: user_id
    rate_limit: {unit: second, requests_per_unit: 1000000, burst: 1000000, consistency: leased$2}
  - key: route
    descriptors:
      - key: user_id
        rate_limit: {unit: second, requests_per_unit: 1000000, burst: 1000000, consistency: leased$2}
R
}
rules leased ""
rules shared ", share: 0.5"

port=$((20000 + RANDOM % 40000))
redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$tmp" >"$tmp/redis.log" 2>&1 &
pids+=($!)
for _ in $(seq 50); do
	[ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break
	sleep 0.1
done

env "${gc_env[@]}" "$tmp/rlsbench" -noop -listen 127.0.0.1:0 2>"$tmp/noop.log" &
noop=$!
pids+=("$noop")
noop_addr=$(field "$(wait_serving "$tmp/noop.log" "$noop")" grpc_addr)

# bench BACKEND MIX TAG ADDR PID [flags]: one measured run, its line on stdout.
bench() {
	local backend=$1 mix=$2 tag=$3 addr=$4 pid=$5
	shift 5
	"$tmp/rlsbench" -addr "$addr" -c "$callers" -conns "$conns" -d "$duration" -warmup "$warmup" \
		-mix "$mix" -backend "$backend" -tag "$tag" -server-pid "$pid" "$@" | tee -a "$tmp/results.jsonl"
}

# sluice CASE MIX TAG: a fresh rls serve for one run.
sluice() {
	local case=$1 mix=$2 tag=$3 args=(--config "$tmp/leased/rules.yaml") bflags=() pid line
	case $case in
	memory) ;;
	*)
		redis-cli -p "$port" flushall >/dev/null
		args=(--config "$tmp/$case/rules.yaml" --redis "redis://127.0.0.1:$port/0" --redis-timeout 100ms)
		bflags=(-redis "127.0.0.1:$port")
		;;
	esac
	env "${gc_env[@]}" "$tmp/rls" serve --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
		--log-format text "${args[@]}" 2>"$tmp/rls.log" &
	pid=$!
	pids+=("$pid")
	line=$(wait_serving "$tmp/rls.log" "$pid")
	if [ "$case" = shared ]; then # shares are held once a heartbeat succeeded
		for _ in $(seq 50); do
			curl -fs "http://$(field "$line" http_addr)/metrics" | grep -q '^ratelimit_share_nodes [1-9]' && break
			sleep 0.1
		done
	fi
	bench "$case" "$mix" "$tag" "$(field "$line" grpc_addr)" "$pid" -metrics "http://$(field "$line" http_addr)/metrics" "${bflags[@]}"
	stop "$pid"
}

for run in $(seq "$runs"); do
	for mix in envoy spread; do
		log "round $run, $mix"
		bench noop "$mix" "run$run" "$noop_addr" "$noop"
		for case in memory leased shared; do
			sluice "$case" "$mix" "run$run"
		done
	done
done

python3 - "$tmp/results.jsonl" >&2 <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
noop = {(r["mix"], r["tag"]): r["qps"] for r in rows if r["backend"] == "noop"}
med = statistics.median
print("| mix | backend | QPS | vs no-op (runs) | p50 ms | p99 ms | server CPU µs/req | Redis cmds/req |")
print("|---|---|--:|--:|--:|--:|--:|--:|")
for mix in ("envoy", "spread"):
    for b in ("noop", "memory", "leased", "shared"):
        rs = [r for r in rows if r["mix"] == mix and r["backend"] == b]
        if not rs:
            continue
        ratios = [100 * r["qps"] / noop[(mix, r["tag"])] for r in rs]
        cmds = [r["redis_cmds_per_req"] for r in rs if "redis_cmds_per_req" in r]
        print(f"| {mix} | {b} | {med(r['qps'] for r in rs):.0f} | {med(ratios):.0f}% ({', '.join(f'{x:.0f}' for x in ratios)}) | "
              f"{med(r['p50_ms'] for r in rs):.2f} | {med(r['p99_ms'] for r in rs):.2f} | {med(r['server_cpu_us_per_req'] for r in rs):.1f} | "
              f"{med(cmds):.4f} |" if cmds else
              f"| {mix} | {b} | {med(r['qps'] for r in rs):.0f} | {med(ratios):.0f}% ({', '.join(f'{x:.0f}' for x in ratios)}) | "
              f"{med(r['p50_ms'] for r in rs):.2f} | {med(r['p99_ms'] for r in rs):.2f} | {med(r['server_cpu_us_per_req'] for r in rs):.1f} | – |")
PY
