#!/usr/bin/env bash
# Start-up CPU of profcol builds, measured apart from the steady state: each
# build in turn runs the node agent (examples/default.yaml at 99 Hz, over the
# same two busy CPUs as node_agent_cost.sh) for 12 s, and its CPU is read
# from a cpuacct cgroup of its own (threads that exit keep their time there)
# at 1.5 s, 5 s and 12 s, with its minor page faults at the end. The builds
# alternate, ROUNDS times: start-up cost apart from the noise of a whole run.
#
#   ROUNDS=4 sudo -E collector/benches/startup_cpu.sh path/to/profcol path/to/other/profcol ...
#
# Prints one line per run: round, binary, CPU (ms) at the three points,
# minor faults. Needs root and a cgroup v1 cpuacct hierarchy.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-4}
[ $# -gt 0 ] || { echo "usage: startup_cpu.sh PROFCOL_BINARY..." >&2; exit 2; }
CPUACCT=/sys/fs/cgroup/cpuacct
[ -w "$CPUACCT" ] || { echo "startup_cpu: needs root and $CPUACCT (cgroup v1)" >&2; exit 1; }
# shellcheck source=receivers/benches/node_config.sh
. receivers/benches/node_config.sh
TMP=$(mktemp -d)
CG=$CPUACCT/profcol-startup-$$
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rmdir "$CG" 2>/dev/null || true
	rm -rf "$TMP"
}
trap cleanup EXIT
node_config 99 "$TMP" '""' >"$TMP/node.yaml"
sh -c 'while :; do :; done' &
PIDS+=($!)
dd if=/dev/zero of=/dev/null bs=4k 2>/dev/null &
PIDS+=($!)
for round in $(seq 1 "$ROUNDS"); do
	for bin in "$@"; do
		mkdir "$CG"
		# Joins the cgroup before exec, so start-up is counted from its first instruction.
		sh -c 'echo $$ >"$1/cgroup.procs"; shift; exec "$@"' sh "$CG" "$bin" --config "$TMP/node.yaml" >"$TMP/agent.log" 2>&1 &
		agent=$!
		t0=$(date +%s.%N)
		cpu=""
		for at in 1.5 5 12; do
			sleep "$(awk -v t0="$t0" -v at="$at" -v now="$(date +%s.%N)" 'BEGIN{d = t0 + at - now; print (d > 0 ? d : 0)}')"
			kill -0 "$agent" 2>/dev/null || { echo "startup_cpu: $bin exited:" >&2; cat "$TMP/agent.log" >&2; exit 1; }
			cpu="$cpu $(awk '{printf "%.1f", $1 / 1e6}' "$CG/cpuacct.usage")"
		done
		minflt=$(awk '{print $10}' "/proc/$agent/stat")
		kill "$agent"
		wait "$agent" 2>/dev/null || true
		# The cgroup empties once the agent's threads are gone.
		until rmdir "$CG" 2>/dev/null; do sleep 0.1; done
		echo "$round $bin cpu@1.5/5/12s ms:$cpu minflt $minflt"
	done
done
