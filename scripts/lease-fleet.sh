#!/usr/bin/env bash
# One hot key over its limit across a fleet (the leased layer's goal): a Redis and
# three `rls serve` nodes sharing one global rule, driven by rlsbench at
# 1.5x the limit spread evenly over the nodes, with --consistency exact and
# then leased. Prints, per run and as medians, the calls admitted over
# burst + rate x T (what the exact bucket lets out of a full bucket in T)
# and Redis' work per request, as Redis itself counts it.
#
# Each run starts from a flushed Redis and fresh nodes (a full bucket, no
# lease out), measures from the first call (no warmup), and stops the nodes
# with SIGTERM. Everything runs on 127.0.0.1; only the PIDs this script
# started are killed. Method: docs/benchmarks.md.
#
# Environment:
#   FLEET_RATE       the rule's requests per second, also its burst  (default 3000)
#   FLEET_LOAD       offered load as a multiple of the rate          (default 1.5)
#   FLEET_DURATION   measured duration of each run                   (default 10s)
#   FLEET_RUNS       runs of each mode; medians                      (default 2)
#   FLEET_NODES      rls serve nodes                                 (default 3)
#   FLEET_C          callers, a multiple of FLEET_NODES              (default 192)
#   FLEET_MODES      consistencies to run                            (default "exact leased")
#   FLEET_REDIS_TIMEOUT  --redis-timeout of the nodes                (default 100ms)
#   FLEET_RESULTS    also keep the raw JSON lines in this file
#   RLS_*            read by `rls serve` like its flags
set -Eeuo pipefail

rate=${FLEET_RATE:-3000}
load_factor=${FLEET_LOAD:-1.5}
duration=${FLEET_DURATION:-10s}
runs=${FLEET_RUNS:-2}
nodes=${FLEET_NODES:-3}
callers=${FLEET_C:-192}
modes=${FLEET_MODES:-exact leased}
# As in bench.sh: on a few shared cores, queueing alone can pass a 10ms
# deadline, and a node answering from its fallback would not be the mode
# under test (the script reports any fallback switch).
redis_timeout=${FLEET_REDIS_TIMEOUT:-100ms}
offered=$(awk -v r="$rate" -v f="$load_factor" 'BEGIN { printf "%.0f", r * f }')

root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/sluice-fleet.XXXXXX")
results="$tmp/results.jsonl"
: >"$results"
pids=()

# cleanup, forget, stop, wait_serving, field.
# shellcheck source=scripts/lib.sh
source "$root/scripts/lib.sh"
trap cleanup EXIT
trap 'echo "fleet: failed at line $LINENO" >&2' ERR
trap 'exit 130' INT TERM

log() { echo "fleet: $*" >&2; }
die() {
	log "$*"
	exit 1
}

# metric URL SERIES: the sum of the samples of one series in /metrics
# (SERIES is the name with its labels, as printed), 0 when absent.
metric() {
	curl -fsS "$1" | awk -v s="$2" 'index($0, s " ") == 1 || index($0, s "{") == 1 { sum += $NF } END { printf "%.0f", sum }'
}

# json LINE NAME: the first value of "NAME" in a JSON line (the run's own:
# rlsbench prints the per-address list last).
json() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -n 1 | cut -d: -f2; }

for tool in redis-server redis-cli curl; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool is not installed (scripts/ensure-deps.sh installs Redis)"
done
if [ $((callers % nodes)) -ne 0 ]; then die "FLEET_C=$callers is not a multiple of FLEET_NODES=$nodes"; fi

log "building rls and rlsbench into $tmp"
(cd "$root" && go build -o "$tmp/rls" ./cmd/rls && go build -o "$tmp/rlsbench" ./cmd/rlsbench)

# The rule sets no consistency: --consistency decides it.
mkdir "$tmp/rules"
cat >"$tmp/rules/rules.yaml" <<EOF
domain: edge
descriptors:
  - key: remote_address
    value: 10.0.0.3
    rate_limit: {unit: second, requests_per_unit: $rate, burst: $rate}
EOF

# --- redis-server on a free loopback port -----------------------------------
redis_port=""
for _ in 1 2 3 4 5 6 7 8 9 10; do
	port=$((20000 + RANDOM % 40000))
	redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no \
		--dir "$tmp" --protected-mode yes >"$tmp/redis.log" 2>&1 &
	pid=$!
	pids+=("$pid")
	for _ in $(seq 50); do
		if [ "$(redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null)" = "PONG" ]; then
			redis_port=$port
			break 2
		fi
		kill -0 "$pid" 2>/dev/null || break
		sleep 0.1
	done
	stop "$pid"
done
[ -n "$redis_port" ] || die "redis-server did not start: $(tail -n 1 "$tmp/redis.log" 2>/dev/null)"
redis_version=$(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p')
log "redis-server $redis_version on 127.0.0.1:$redis_port"

# run MODE N: one measured run of MODE against fresh nodes.
run() {
	local mode=$1 n=$2 i line node_pids=() grpc=() http=() addrs out
	redis-cli -h 127.0.0.1 -p "$redis_port" flushall >/dev/null
	for i in $(seq "$nodes"); do
		"$tmp/rls" serve --grpc-addr 127.0.0.1:0 --http-addr 127.0.0.1:0 --admin-addr 127.0.0.1:0 \
			--log-format text --config "$tmp/rules/rules.yaml" --consistency "$mode" \
			--redis "redis://127.0.0.1:$redis_port/0" --redis-timeout "$redis_timeout" \
			2>"$tmp/rls-$i.log" &
		node_pids+=($!)
		pids+=($!)
	done
	for i in $(seq "$nodes"); do
		line=$(wait_serving "$tmp/rls-$i.log" "${node_pids[i - 1]}") || {
			cat "$tmp/rls-$i.log" >&2
			die "node $i did not serve"
		}
		grpc+=("$(field "$line" grpc_addr)")
		http+=("http://$(field "$line" http_addr)/metrics")
	done
	# Lease sizes follow the live node count: wait until every node counts
	# the whole fleet.
	for i in $(seq "$nodes"); do
		for _ in $(seq 300); do
			[ "$(metric "${http[i - 1]}" ratelimit_live_nodes)" = "$nodes" ] && continue 2
			sleep 0.1
		done
		die "node $i does not count $nodes live nodes"
	done
	addrs=$(
		IFS=,
		echo "${grpc[*]}"
	)
	out=$("$tmp/rlsbench" -addr "$addrs" -c "$callers" -conns 1 -d "$duration" -warmup 0s \
		-mix hot -hot-value 10.0.0.3 -rate "$offered" -redis "127.0.0.1:$redis_port" \
		-backend redis -tag "$mode" 2>"$tmp/rlsbench.err") || {
		cat "$tmp/rlsbench.err" >&2
		die "$mode run $n: rlsbench failed"
	}
	local fallbacks=0 from_lease=0 waited=0
	for i in $(seq "$nodes"); do
		fallbacks=$((fallbacks + $(metric "${http[i - 1]}" 'ratelimit_fallback_transitions_total{to="fallback"}')))
		from_lease=$((from_lease + $(metric "${http[i - 1]}" 'ratelimit_lease_decisions_total{answer="lease"}')))
		waited=$((waited + $(metric "${http[i - 1]}" 'ratelimit_lease_decisions_total{answer="redis"}')))
	done
	for i in $(seq "$nodes"); do
		stop "${node_pids[i - 1]}"
	done
	echo "$out" | sed "s/^{/{\"fallbacks\":$fallbacks,\"from_lease\":$from_lease,\"waited\":$waited,/" >>"$results"
	log "$mode run $n: $(json "$out" ok) admitted of $(json "$out" total), $fallbacks fallback switches"
}

log "load average before: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
for n in $(seq "$runs"); do
	for mode in $modes; do # interleaved, so drift hits both modes alike
		run "$mode" "$n"
	done
done
log "load average after: $(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo unknown)"
if [ -n "${FLEET_RESULTS:-}" ]; then cp "$results" "$FLEET_RESULTS"; fi

# --- report -----------------------------------------------------------------
# median: the median of the numbers on stdin, one a line.
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "n/a"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "Machine: $(nproc) CPUs, $(go version | cut -d' ' -f3-4), redis $redis_version."
echo "One key, rule $rate/s with burst $rate; $nodes nodes, --redis-timeout $redis_timeout; rlsbench -mix hot -rate $offered (${load_factor}x) -c $callers over the nodes, $duration from a full bucket, no warmup; median of $runs run(s)."
echo
echo "| consistency | run | calls | admitted | burst + rate × T | admitted / bound | errors | Redis scripts/req | Redis round trips/req | Redis cmds/req | Redis CPU µs/req | from a lease | waited on Redis | fallback switches |"
echo "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
row() { # MODE RUN FIGURES...: one table row
	local mode=$1 run=$2
	shift 2
	printf '| %s | %s |' "$mode" "$run"
	printf ' %s |' "$@"
	echo
}
for mode in $modes; do
	rows="$tmp/$mode.tsv"
	: >"$rows"
	while IFS= read -r line; do
		[ "$(json "$line" tag)" = "\"$mode\"" ] || continue
		d=$(json "$line" duration_s)
		ok=$(json "$line" ok)
		awk -v ok="$ok" -v d="$d" -v r="$rate" -v t="$(json "$line" total)" -v e="$(json "$line" error)" \
			-v s="$(json "$line" redis_scripts_per_req)" -v rt="$(json "$line" redis_round_trips_per_req)" \
			-v c="$(json "$line" redis_cmds_per_req)" -v cpu="$(json "$line" redis_cpu_us_per_req)" \
			-v fl="$(json "$line" from_lease)" -v w="$(json "$line" waited)" -v fb="$(json "$line" fallbacks)" \
			'BEGIN { b = r + r * d; printf "%d\t%d\t%.0f\t%.2f%%\t%d\t%.4f\t%.4f\t%.4f\t%.2f\t%d\t%d\t%d\n", t, ok, b, 100 * ok / b, e, s, rt, c, cpu, fl, w, fb }' >>"$rows"
	done <"$results"
	n=0
	while IFS=$'\t' read -r -a f; do
		n=$((n + 1))
		row "$mode" "$n" "${f[@]}"
	done <"$rows"
	# The median row keeps each column's format (calls, %, per request).
	formats=(%.0f %.0f %.0f %.2f%% %.0f %.4f %.4f %.4f %.2f %.0f %.0f %.0f)
	med=()
	for col in $(seq 12); do
		# shellcheck disable=SC2059 # the format is the column's
		med+=("$(printf "${formats[col - 1]}" "$(cut -f "$col" "$rows" | tr -d '%' | median)")")
	done
	row "$mode" "median" "${med[@]}"
done
