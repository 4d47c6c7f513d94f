# shellcheck shell=bash
# Helpers shared by scripts/bench.sh and scripts/lease-fleet.sh, which
# source this file: the processes a script started (its array pids, which
# cleanup kills) and the log lines of `rls serve`.

# cleanup, the scripts' EXIT trap: SIGTERM every process in pids, SIGKILL
# those still alive after 2s, and remove the script's $tmp.
cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		kill "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		for _ in 1 2 3 4 5 6 7 8 9 10; do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.2
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$tmp"
}

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
