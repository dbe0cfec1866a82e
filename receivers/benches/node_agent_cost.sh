#!/usr/bin/env bash
# Steady-state cost of the whole node agent vs `perf record -F 99 -a -g`,
# all running at the same time over the same load.
#
#   sudo receivers/benches/node_agent_cost.sh              # 3 runs of 140 s
#   RUNS=1 sudo receivers/benches/node_agent_cost.sh       # one run
#   PROFCOL_BIN=path/to/profcol sudo -E receivers/benches/node_agent_cost.sh   # a given build
#
# Each run starts, at once and over one load (two busy CPUs: a shell loop
# and `dd if=/dev/zero of=/dev/null`):
#   - node:  the release `profcol` binary with examples/default.yaml (ebpf ->
#            kernel_symbols -> pprof + debug), sample_frequency raised to 99;
#   - debug: the same binary with ebpf -> debug only, 99 Hz, the receiver
#            set as the node agent's (count_in_kernel, report_interval);
#   - perf:  perf record -F 99 -a -g (Debian linux-perf);
#   - before: with BEFORE_BIN=path/to/an/older/profcol, that binary with the
#            node config too (its metrics on a port of its own): a change's
#            before and after over the same load (BEFORE_NO_RUNTIME=1 for
#            binaries older than service.runtime; BEFORE_CONFIG=path/to/its
#            examples/default.yaml for the node agent as that checkout shipped it;
#            ONLY_BEFORE=1 runs it and perf without this build's agents).
# It reads each process's CPU time at START_AT (10 s) and END_AT (START_AT
# plus two of the node agent's report intervals, 130 s with its 60 s: the
# window holds exactly two reports whatever their phase) after the start — from a cgroup of its own (cpuacct.usage on cgroup v1,
# cpu.stat usage_usec on v2), which keeps the time of threads that have
# exited; where no cgroup can be made, the sum of the first field of
# /proc/PID/task/*/schedstat, which loses it (a tokio blocking thread ends
# after 10 s idle and takes its CPU out of the sum) — and RSS (VmRSS, VmHWM) at RSS_AT (END_AT + 10 s).
# Steady state is the slope between the two reads (ms of CPU per second);
# start-up is the CPU at START_AT minus START_AT seconds of that slope.
# Each run starts from binaries read from disk, as at a host's boot: the
# page cache of profcol's and perf's executables is emptied first (EVICT=0
# keeps it). How a binary reached the page cache decides how much of it the
# kernel maps around each fault: one just written by the linker or cp sits
# in the cache whole, and its agent maps ~1.5 MiB more of it.
# Lines: RUN (one per tool per run), then MEDIAN and RATIO over the runs.
# Needs root, perf.
set -euo pipefail
cd "$(dirname "$0")/../.."

RUNS=${RUNS:-3}
FREQ=${FREQ:-99}
# shellcheck source=receivers/benches/node_config.sh
. receivers/benches/node_config.sh
# The node agent's report interval, in seconds (examples/default.yaml).
REPORT_S=$(node_report_seconds)
START_AT=${START_AT:-10}
END_AT=${END_AT:-$((START_AT + 2 * REPORT_S))}
RSS_AT=${RSS_AT:-$((END_AT + 10))}
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

# PROFCOL_BIN=path: that binary instead of this checkout's release build.
if [ -z "${PROFCOL_BIN:-}" ]; then
	cargo build --release -q -p profcol --bin profcol
fi
BIN=${PROFCOL_BIN:-${CARGO_TARGET_DIR:-target}/release/profcol}
BEFORE_BIN=${BEFORE_BIN:-}
TOOLS="node debug perf"
[ -n "$BEFORE_BIN" ] && TOOLS="node before debug perf"
# ONLY_BEFORE=1: the older binary and perf alone. Run beside them, this
# build's agents profile the older agent too (and build the unwind table of
# its binary, a few MiB of peak RSS); runs of each build alone, alternated,
# keep that out of both.
[ -n "$BEFORE_BIN" ] && [ "${ONLY_BEFORE:-0}" = 1 ] && TOOLS="before perf"

# The default node agent at FREQ, writing into TMP; each agent serves its
# metrics (on by default) on a port of its own, so both can start.
METRICS_PORT=${METRICS_PORT:-18887}
node_config "$FREQ" "$TMP" "127.0.0.1:$METRICS_PORT" >"$TMP/node.yaml"
# The older binary gets the node agent's config as it is, runtime section
# included; BEFORE_NO_RUNTIME=1 drops that section for binaries older than
# service.runtime (32650a8), which would refuse it — and then the two
# agents differ in threads and malloc arenas, not only in code.
STRIP_RUNTIME=()
[ "${BEFORE_NO_RUNTIME:-0}" = 1 ] && STRIP_RUNTIME=(-e "/^  runtime:/,/malloc_arenas/d")
# BEFORE_CONFIG=path/to/older/examples/default.yaml gives it that checkout's
# own node agent instead (as its users ran it), set to FREQ the same way.
if [ -n "${BEFORE_CONFIG:-}" ]; then
	node_config "$FREQ" "$TMP/before" "127.0.0.1:$((METRICS_PORT + 2))" "$BEFORE_CONFIG" >"$TMP/before.yaml"
else
	sed "${STRIP_RUNTIME[@]}" -e "s|$TMP/profiles|$TMP/profiles-before|" -e "s|address: 127.0.0.1:$METRICS_PORT|address: 127.0.0.1:$((METRICS_PORT + 2))|" \
		"$TMP/node.yaml" >"$TMP/before.yaml"
fi
cat >"$TMP/debug.yaml" <<EOF
receivers:
  ebpf:
    sample_frequency: $FREQ
    report_interval: ${REPORT_S}s   # as the node agent's receiver
    count_in_kernel: true
exporters:
  debug:
    verbosity: basic
service:
  telemetry:
    metrics:
      address: 127.0.0.1:$((METRICS_PORT + 1))
  pipelines:
    profiles:
      receivers: [ebpf]
      exporters: [debug]
EOF

# ns on CPU of every live thread of PID (%.0f: awk's %d stops at 2^31 ns,
# 2.1 s, which an agent building unwind tables passes within a minute)
# shellcheck source=receivers/benches/cgroup_cpu.sh
. receivers/benches/cgroup_cpu.sh
kib() { awk -v k="$2" '$1 == k":" {print $2}' /proc/"$1"/status; }

EXES=("$BIN" "$(readlink -f "$(command -v perf)")")
[ -n "$BEFORE_BIN" ] && EXES+=("$BEFORE_BIN")

printf 'load average before: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
RESULTS=$TMP/results
: >"$RESULTS"
for run in $(seq "$RUNS"); do
	PIDS=()
	[ "${EVICT:-1}" = 1 ] && evict "${EXES[@]}"
	sh -c 'while :; do :; done' &
	PIDS+=($!)
	dd if=/dev/zero of=/dev/null bs=4k 2>/dev/null &
	PIDS+=($!)
	sleep 1
	declare -A PID=()
	if [[ " $TOOLS " == *" node "* ]]; then
		start_in node "$BIN" --config "$TMP/node.yaml" >"$TMP/node.log" 2>&1 &
		PID[node]=$!
		start_in debug "$BIN" --config "$TMP/debug.yaml" >"$TMP/debug.log" 2>&1 &
		PID[debug]=$!
	fi
	if [ -n "$BEFORE_BIN" ]; then
		start_in before "$BEFORE_BIN" --config "$TMP/before.yaml" >"$TMP/before.log" 2>&1 &
		PID[before]=$!
	fi
	start_in perf perf record -F "$FREQ" -a -g -o "$TMP/perf.data" >"$TMP/perf.log" 2>&1 &
	PID[perf]=$!
	PIDS+=("${PID[@]}")
	t0=$(date +%s.%N)
	until_at() { sleep "$(awk -v t0="$t0" -v at="$1" -v now="$(date +%s.%N)" 'BEGIN{d = t0 + at - now; print (d > 0 ? d : 0)}')"; }
	declare -A C10=() C40=()
	until_at "$START_AT"
	for t in $TOOLS; do
		kill -0 "${PID[$t]}" 2>/dev/null || { echo "$t exited early:"; cat "$TMP/$t.log"; exit 1; }
		C10[$t]=$(cpu_ns "$t" "${PID[$t]}")
	done
	until_at "$END_AT"
	for t in $TOOLS; do C40[$t]=$(cpu_ns "$t" "${PID[$t]}"); done
	until_at "$RSS_AT"
	for t in $TOOLS; do
		rss=$(kib "${PID[$t]}" VmRSS)
		hwm=$(kib "${PID[$t]}" VmHWM)
		awk -v run="$run" -v t="$t" -v a="${C10[$t]}" -v b="${C40[$t]}" -v s="$START_AT" -v e="$END_AT" \
			-v r="$RSS_AT" -v rss="$rss" -v hwm="$hwm" 'BEGIN{
			slope = (b - a) / 1e6 / (e - s); start = a / 1e6 - s * slope
			printf "RUN %d %-6s cpu@%ds %8.1f ms  cpu@%ds %8.1f ms  steady %7.3f ms/s  start-up %7.1f ms  RSS@%ds %6d KiB  peak %6d KiB\n",
				run, t, s, a / 1e6, e, b / 1e6, slope, start, r, rss, hwm
			printf "%d %s %f %f %d %d\n", run, t, slope, start, rss, hwm >> "'"$RESULTS"'"
		}'
		# What of that RSS is BPF maps mapped into the process: writable
		# (the unwinder's row chunks) and read-only (the ring buffers).
		[ "$t" = perf ] || awk -v run="$run" -v t="$t" '
			/^[0-9a-f]+-[0-9a-f]+ / { m = ($6 == "anon_inode:bpf-map") ? $2 : "" }
			/^Rss:/ && m != "" { kb[m] += $2; if ($2 > 0) n[m]++ }
			END { printf "MAPS %d %-6s bpf maps rw %6d KiB (%d mappings)  ro %6d KiB\n", run, t, kb["rw-s"], n["rw-s"], kb["r--s"] }' \
			"/proc/${PID[$t]}/smaps"
	done
	kill -INT "${PID[perf]}"
	kill -TERM ${PID[node]:-} ${PID[debug]:-} ${PID[before]:-}
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	for t in ${TOOLS% perf}; do
		grep -q 'perf events attached' "$TMP/$t.log" || { echo "$t agent did not start:"; cat "$TMP/$t.log"; exit 1; }
	done
	rm -f "$TMP/perf.data"
	cg_clear
	printf 'load average after run %d: %s\n' "$run" "$(cut -d' ' -f1-3 /proc/loadavg)"
done

python3 - "$RESULTS" "$RSS_AT" <<'EOF'
import statistics, sys
at = sys.argv[2]
rows = [l.split() for l in open(sys.argv[1])]
by = {}
for run, tool, slope, start, rss, hwm in rows:
    by.setdefault(tool, []).append((float(slope), float(start), int(rss), int(hwm)))
med = {t: [statistics.median(v[i] for v in vals) for i in range(4)] for t, vals in by.items()}
for t, (slope, start, rss, hwm) in med.items():
    print(f"MEDIAN {t:6} steady {slope:.3f} ms/s  start-up {start:.1f} ms  RSS@{at}s {rss} KiB  peak {hwm} KiB")
p = med["perf"]
# Per run ratios too: the runs share their load, medians of ratios are steadier.
for t in [t for t in ("node", "before", "debug") if t in by]:
    rs = [a[0] / b[0] for a, b in zip(by[t], by["perf"]) if b[0] > 0]
    print(f"RATIO {t}/perf steady {med[t][0] / p[0]:.2f}x (per run {', '.join(f'{r:.2f}' for r in rs)})"
          f"  start-up {med[t][1] / p[1]:.2f}x  RSS@{at}s {med[t][2] / p[2]:.2f}x  peak RSS {med[t][3] / p[3]:.2f}x")
EOF
