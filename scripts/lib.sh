# shellcheck shell=bash
# Helpers shared by scripts/bench.sh and scripts/lease-fleet.sh, which
# source this file: the processes a script started (its array pids, which
# its cleanup kills) and the log lines of `rls serve`.

# forget PID: drop a process the script stopped from the cleanup list.
forget() {
	local keep=() p
	for p in "${pids[@]}"; do
		[ "$p" = "$1" ] || keep+=("$p")
	done
	pids=("${keep[@]}")
}

# stop PID: SIGTERM one process the script started (an rls node gives its
# leases back) and wait for it.
stop() {
	kill "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
	forget "$1"
}

# wait_serving LOG PID: print the line `msg=serving grpc_addr=...` once the
# process logs it; fail if the process exits or takes over 30s.
wait_serving() {
	local line
	for _ in $(seq 300); do
		line=$(grep -m 1 'msg=serving ' "$1" || true)
		if [ -n "$line" ]; then
			echo "$line"
			return 0
		fi
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# field LINE NAME: the value of NAME=value in a log line.
field() { sed -n "s/.* $2=\\([^ ]*\\).*/\\1/p" <<<"$1"; }
