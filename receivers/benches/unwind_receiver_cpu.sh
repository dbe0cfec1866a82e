#!/usr/bin/env bash
# Steady-state CPU of the ebpf receiver with `unwind.mode: auto` (tables)
# against `unwind.mode: frame_pointers`, both running at the same time over
# the same load (goal: auto ≤ 1.3× frame_pointers).
#
#   sudo receivers/benches/unwind_receiver_cpu.sh            # 3 runs of 45 s
#   RUNS=1 sudo receivers/benches/unwind_receiver_cpu.sh     # one run
#
# Each run starts, at once and over one load of binaries that need tables
# (Debian's python3 in a loop; `head -c 20M /dev/zero | sha256sum` started
# again and again: new processes all the time; examples/workloads/deep.c
# built -O2 -fomit-frame-pointer):
#   - auto: the release `profcol` binary, ebpf (99 Hz, unwind.mode auto) -> debug;
#   - fp:   the same with unwind.mode frame_pointers.
# It reads each agent's CPU time (from a cgroup per agent, so exited
# threads count: receivers/benches/cgroup_cpu.sh) at START_AT (10 s) and
# END_AT (40 s) after the start; steady state is the slope between them
# (ms of CPU per second). The auto agent's /metrics at END_AT show that
# tables were built and used (stack ends by reason).
# Lines: RUN (one per agent per run), UNWIND (auto's counters per run),
# then MEDIAN and RATIO over the runs. Needs root, cc, /usr/bin/python3.
set -euo pipefail
cd "$(dirname "$0")/../.."

RUNS=${RUNS:-3}
FREQ=${FREQ:-99}
START_AT=${START_AT:-10}
END_AT=${END_AT:-40}
TMP=$(mktemp -d)
PIDS=()
CG=""
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$TMP"
	[ -n "$CG" ] && cg_remove
	true
}
trap cleanup EXIT

# PROFCOL_BIN: a profcol binary built already (else the release build).
if [ -z "${PROFCOL_BIN:-}" ]; then
	cargo build --release -q -p profcol --bin profcol
	PROFCOL_BIN=${CARGO_TARGET_DIR:-target}/release/profcol
fi
BIN=$PROFCOL_BIN
"${CC:-cc}" -O2 -fomit-frame-pointer -o "$TMP/deep" examples/workloads/deep.c

METRICS_PORT=${METRICS_PORT:-18897}
agent_config() { # mode port
	cat <<EOF
receivers:
  ebpf:
    sample_frequency: $FREQ
    report_interval: 5s
    unwind:
      mode: $1
exporters:
  debug:
    verbosity: basic
service:
  telemetry:
    metrics:
      address: 127.0.0.1:$2
  pipelines:
    profiles:
      receivers: [ebpf]
      exporters: [debug]
EOF
}
agent_config auto "$METRICS_PORT" >"$TMP/auto.yaml"
agent_config frame_pointers "$((METRICS_PORT + 1))" >"$TMP/fp.yaml"

# ns on CPU of every live thread of PID
# shellcheck source=receivers/benches/cgroup_cpu.sh
. receivers/benches/cgroup_cpu.sh
metric() { # name [label filter]
	python3 -c 'import sys, urllib.request
text = urllib.request.urlopen(sys.argv[1]).read().decode()
print(sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
          if l.startswith(sys.argv[2]) and sys.argv[3] in l))' \
		"http://127.0.0.1:$METRICS_PORT/metrics" "$1" "${2:-}"
}

printf 'load average before: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
RESULTS=$TMP/results
: >"$RESULTS"
for run in $(seq "$RUNS"); do
	PIDS=()
	/usr/bin/python3 -c 'while True: sum(i * i for i in range(1000))' &
	PIDS+=($!)
	sh -c 'while :; do head -c 20000000 /dev/zero | sha256sum >/dev/null; done' &
	PIDS+=($!)
	echo go | "$TMP/deep" 100000 >/dev/null &
	PIDS+=($!)
	sleep 1
	declare -A PID=()
	start_in auto "$BIN" --config "$TMP/auto.yaml" >"$TMP/auto.log" 2>&1 &
	PID[auto]=$!
	start_in fp "$BIN" --config "$TMP/fp.yaml" >"$TMP/fp.log" 2>&1 &
	PID[fp]=$!
	PIDS+=("${PID[@]}")
	t0=$(date +%s.%N)
	until_at() { sleep "$(awk -v t0="$t0" -v at="$1" -v now="$(date +%s.%N)" 'BEGIN{d = t0 + at - now; print (d > 0 ? d : 0)}')"; }
	declare -A C10=() C40=()
	until_at "$START_AT"
	for t in auto fp; do
		kill -0 "${PID[$t]}" 2>/dev/null || { echo "$t exited early:"; cat "$TMP/$t.log"; exit 1; }
		C10[$t]=$(cpu_ns "$t" "${PID[$t]}")
	done
	until_at "$END_AT"
	for t in auto fp; do C40[$t]=$(cpu_ns "$t" "${PID[$t]}"); done
	for t in auto fp; do
		awk -v run="$run" -v t="$t" -v a="${C10[$t]}" -v b="${C40[$t]}" -v s="$START_AT" -v e="$END_AT" 'BEGIN{
			slope = (b - a) / 1e6 / (e - s)
			printf "RUN %d %-4s cpu@%ds %8.1f ms  cpu@%ds %8.1f ms  steady %7.3f ms/s\n", run, t, s, a / 1e6, e, b / 1e6, slope
			printf "%d %s %f\n", run, t, slope >> "'"$RESULTS"'"
		}'
	done
	m=profcol_receiver_ebpf_unwind
	printf 'UNWIND %d tables built %s (%s ms), loaded %s (%s bytes); stack ends: outermost %s, no_table %s, unsupported %s, depth %s, read_error %s\n' \
		"$run" "$(metric ${m}_table_builds_total)" "$(metric ${m}_table_build_microseconds_total | awk '{print $1 / 1000}')" \
		"$(metric ${m}_tables_loaded)" "$(metric ${m}_table_bytes)" \
		"$(metric ${m}_stack_end_total outermost)" "$(metric ${m}_stack_end_total no_table)" \
		"$(metric ${m}_stack_end_total unsupported)" "$(metric ${m}_stack_end_total depth)" \
		"$(metric ${m}_stack_end_total read_error)"
	[ "$(metric ${m}_table_builds_total | cut -d. -f1)" -gt 0 ] || { echo "auto built no table"; exit 1; }
	kill -TERM "${PID[auto]}" "${PID[fp]}"
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	for t in auto fp; do
		grep -q 'perf events attached' "$TMP/$t.log" || { echo "$t agent did not start:"; cat "$TMP/$t.log"; exit 1; }
	done
	cg_clear
	printf 'load average after run %d: %s\n' "$run" "$(cut -d' ' -f1-3 /proc/loadavg)"
done

python3 - "$RESULTS" <<'EOF'
import statistics, sys
by = {}
for run, tool, slope in (l.split() for l in open(sys.argv[1])):
    by.setdefault(tool, []).append(float(slope))
for t, v in by.items():
    print(f"MEDIAN {t:4} steady {statistics.median(v):.3f} ms/s")
rs = [a / b for a, b in zip(by["auto"], by["fp"]) if b > 0]
print(f"RATIO auto/fp steady {statistics.median(by['auto']) / statistics.median(by['fp']):.2f}x"
      f" (per run {', '.join(f'{r:.2f}' for r in rs)}; goal <= 1.3x)")
EOF
