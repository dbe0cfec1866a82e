#!/usr/bin/env bash
# What the node agent's report interval costs: the embedded node agent
# (examples/default.yaml at 99 Hz) with report_interval 5, 15, 30 and 60 s,
# all four and `perf record -F 99 -a -g` running at once over one load (two
# busy CPUs: a shell loop and `dd`), each agent's CPU per second over the
# same window, and its distinct stacks per report (the debug exporter's
# summary lines).
#
#   sudo receivers/benches/report_interval_cost.sh
#   PROFCOL_BIN=path/to/profcol INTERVALS="5 60" sudo -E receivers/benches/report_interval_cost.sh
#
# CPU comes from a cgroup per tool (receivers/benches/cgroup_cpu.sh), read
# at START_AT (10 s) and START_AT + WINDOW (120 s: a multiple of every
# interval, so each agent's window holds whole reports). The agents sample
# each other too (a little of each one's load is the others'). Lines:
# `INTERVAL s  steady ms/s  ratio to perf  stacks per report  peak RSS`.
# Needs root, perf.
set -euo pipefail
cd "$(dirname "$0")/../.."

INTERVALS=${INTERVALS:-5 15 30 60}
FREQ=${FREQ:-99}
START_AT=${START_AT:-10}
WINDOW=${WINDOW:-120}
TMP=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$TMP"
	cg_remove 2>/dev/null || true
}
trap cleanup EXIT

if [ -z "${PROFCOL_BIN:-}" ]; then
	cargo build --release -q -p profcol --bin profcol
fi
BIN=${PROFCOL_BIN:-${CARGO_TARGET_DIR:-target}/release/profcol}

# shellcheck source=receivers/benches/node_config.sh
. receivers/benches/node_config.sh
# shellcheck source=receivers/benches/cgroup_cpu.sh
. receivers/benches/cgroup_cpu.sh
port=${METRICS_PORT:-19000}
for iv in $INTERVALS; do
	mkdir -p "$TMP/$iv"
	node_config "$FREQ" "$TMP/$iv" "127.0.0.1:$port" |
		sed -E "s/^( *report_interval: *)[0-9]+s *$/\1${iv}s/" >"$TMP/$iv.yaml"
	grep -q "report_interval: ${iv}s\$" "$TMP/$iv.yaml" || { echo "no report_interval line in examples/default.yaml" >&2; exit 1; }
	port=$((port + 1))
done

sh -c 'while :; do :; done' &
PIDS+=($!)
dd if=/dev/zero of=/dev/null bs=4k 2>/dev/null &
PIDS+=($!)
sleep 1
declare -A PID=() C0=()
for iv in $INTERVALS; do
	start_in "n$iv" "$BIN" --config "$TMP/$iv.yaml" >"$TMP/$iv.log" 2>&1 &
	PID[n$iv]=$!
done
start_in perf perf record -F "$FREQ" -a -g -o "$TMP/perf.data" >"$TMP/perf.log" 2>&1 &
PID[perf]=$!
PIDS+=("${PID[@]}")
sleep "$START_AT"
for t in "${!PID[@]}"; do C0[$t]=$(cpu_ns "$t" "${PID[$t]}"); done
sleep "$WINDOW"
declare -A SLOPE=()
for t in "${!PID[@]}"; do
	kill -0 "${PID[$t]}" 2>/dev/null || { echo "$t exited early:"; cat "$TMP/${t#n}.log" 2>/dev/null; exit 1; }
	SLOPE[$t]=$(awk -v a="${C0[$t]}" -v b="$(cpu_ns "$t" "${PID[$t]}")" -v w="$WINDOW" 'BEGIN{printf "%.3f", (b - a) / 1e6 / w}')
done
printf 'perf record -F %s -a -g: steady %s ms/s\n' "$FREQ" "${SLOPE[perf]}"
for iv in $INTERVALS; do
	# Distinct stacks per report: the debug exporter's `stacks=` of each
	# whole report (the first may hold start-up's, the last is partial).
	stacks=$(grep -o 'stacks=[0-9]*' "$TMP/$iv.log" | cut -d= -f2 | sed -n '2,$p' | awk '{s += $1; n++} END {printf "%.0f", n ? s / n : 0}')
	hwm=$(awk '/VmHWM/ {print $2}' "/proc/${PID[n$iv]}/status")
	awk -v iv="$iv" -v s="${SLOPE[n$iv]}" -v p="${SLOPE[perf]}" -v st="$stacks" -v hwm="$hwm" \
		'BEGIN{printf "INTERVAL %3d s  steady %.3f ms/s  %.2fx perf  %s stacks per report  peak RSS %d KiB\n", iv, s, s / p, st, hwm}'
done
kill -INT "${PID[perf]}"
