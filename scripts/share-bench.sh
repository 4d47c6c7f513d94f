#!/usr/bin/env bash
# Standing shares side by side: the no-op RLS, sluice on its memory global
# layer, and sluice on Redis with every global rule leased, then leased with
# share 0.5 (each on a redis-server of its own), each under the envoy and
# spread mixes, the runs of one round back to back. The servers stay up for
# the whole run. Prints one JSON line per run (rlsbench's) on stdout, and a
# summary of medians on stderr. Method: docs/benchmarks.md.
#
# Environment: BENCH_DURATION (5s), BENCH_RUNS (5), BENCH_WARMUP (1s),
# BENCH_C (64), BENCH_CONNS (4).
set -Eeuo pipefail

duration=${BENCH_DURATION:-5s}
runs=${BENCH_RUNS:-5}
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

# start_redis NAME: a redis-server of its own for one case, so that no other
# case's background work (heartbeats, lease returns) counts as its commands.
declare -A redis_port
start_redis() {
	local port=$((20000 + RANDOM % 40000))
	redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$tmp" >"$tmp/redis-$1.log" 2>&1 &
	pids+=($!)
	for _ in $(seq 50); do
		[ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break
		sleep 0.1
	done
	redis_port[$1]=$port
}

env "${gc_env[@]}" "$tmp/rlsbench" -noop -listen 127.0.0.1:0 2>"$tmp/noop.log" &
noop=$!
pids+=("$noop")
declare -A addr pid metrics
addr[noop]=$(field "$(wait_serving "$tmp/noop.log" "$noop")" grpc_addr)
pid[noop]=$noop

# serve CASE: one rls serve per case, up for the whole run as in production
# (its tables, connections and leases warm from round to round).
serve() {
	local case=$1 args=(--config "$tmp/leased/rules.yaml") line
	if [ "$case" != memory ]; then
		start_redis "$case"
		args=(--config "$tmp/$case/rules.yaml" --redis "redis://127.0.0.1:${redis_port[$case]}/0" --redis-timeout 100ms)
	fi
	env "${gc_env[@]}" "$tmp/rls" serve --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
		--log-format text "${args[@]}" 2>"$tmp/rls-$case.log" &
	pid[$case]=$!
	pids+=("${pid[$case]}")
	line=$(wait_serving "$tmp/rls-$case.log" "${pid[$case]}")
	addr[$case]=$(field "$line" grpc_addr)
	metrics[$case]="http://$(field "$line" http_addr)/metrics"
	if [ "$case" = shared ]; then # shares are held once the registry settled
		for _ in $(seq 100); do
			curl -fs "${metrics[$case]}" | grep -q '^ratelimit_share_nodes [1-9]' && break
			sleep 0.1
		done
	fi
}
for case in memory leased shared; do
	serve "$case"
done

# bench CASE MIX TAG: one measured run, its line on stdout.
bench() {
	local case=$1 mix=$2 tag=$3 flags=()
	if [ "$case" != noop ]; then
		flags+=(-metrics "${metrics[$case]}")
	fi
	if [ -n "${redis_port[$case]:-}" ]; then
		flags+=(-redis "127.0.0.1:${redis_port[$case]}")
	fi
	"$tmp/rlsbench" -addr "${addr[$case]}" -c "$callers" -conns "$conns" -d "$duration" -warmup "$warmup" \
		-mix "$mix" -backend "$case" -tag "$tag" -server-pid "${pid[$case]}" "${flags[@]}" | tee -a "$tmp/results.jsonl"
}

for run in $(seq "$runs"); do
	for mix in envoy spread; do
		log "round $run, $mix"
		for case in noop memory leased shared; do
			bench "$case" "$mix" "run$run"
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
