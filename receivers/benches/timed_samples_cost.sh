#!/usr/bin/env bash
# Steady-state CPU of the node agent with a time on every sample (what an
# OTLP user runs: count_in_kernel off, 5 s reports) against `perf record -F
# 99 -a -g`, both at once over one load of two busy CPUs (a shell loop and
# `dd if=/dev/zero of=/dev/null`), each in a cgroup of its own.
#
#   sudo receivers/benches/timed_samples_cost.sh               # 60 s window
#   SECS=120 PROFCOL_BIN=path/to/profcol sudo -E receivers/benches/timed_samples_cost.sh
#
# The agent runs ebpf (99 Hz, report_interval 5s, count_in_kernel false) ->
# kernel_symbols -> pprof files. CPU is read at START_AT (10 s) and
# START_AT + SECS. Lines: CPU (ms of CPU per second of each, and the
# ratio), then the samples of the three busiest threads (by comm) in the
# agent's pprof files and in perf's data: the agent's totals must not move
# when its CPU does. Needs root, perf, python3.
set -euo pipefail
cd "$(dirname "$0")/../.."

FREQ=${FREQ:-99}
SECS=${SECS:-60}
START_AT=${START_AT:-10}
TMP=$(mktemp -d)
PIDS=()
CG=""
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	[ -n "${KEEP:-}" ] || rm -rf "$TMP"
	[ -n "$CG" ] && cg_remove
	true
}
trap cleanup EXIT

if [ -z "${PROFCOL_BIN:-}" ]; then
	cargo build --release -q -p profcol --bin profcol
fi
BIN=${PROFCOL_BIN:-${CARGO_TARGET_DIR:-target}/release/profcol}
cat >"$TMP/node.yaml" <<EOF
receivers:
  ebpf:
    sample_frequency: $FREQ
    report_interval: 5s
    count_in_kernel: false
processors:
  kernel_symbols:
exporters:
  pprof:
    directory: $TMP/profiles
service:
  telemetry:
    metrics:
      address: ""
  runtime:
    worker_threads: 1
    malloc_arenas: 1
  pipelines:
    profiles:
      receivers: [ebpf]
      processors: [kernel_symbols]
      exporters: [pprof]
EOF

# shellcheck source=receivers/benches/cgroup_cpu.sh
. receivers/benches/cgroup_cpu.sh

printf 'load average before: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
sh -c 'while :; do :; done' &
PIDS+=($!)
dd if=/dev/zero of=/dev/null bs=4k 2>/dev/null &
PIDS+=($!)
sleep 1
start_in node "$BIN" --config "$TMP/node.yaml" >"$TMP/node.log" 2>&1 &
NODE=$!
start_in perf perf record -F "$FREQ" -a -g -o "$TMP/perf.data" >"$TMP/perf.log" 2>&1 &
PERF=$!
PIDS+=("$NODE" "$PERF")
sleep "$START_AT"
for p in "$NODE" "$PERF"; do kill -0 "$p" 2>/dev/null || { echo "exited early:"; cat "$TMP"/*.log; exit 1; }; done
a_node=$(cpu_ns node "$NODE")
a_perf=$(cpu_ns perf "$PERF")
sleep "$SECS"
b_node=$(cpu_ns node "$NODE")
b_perf=$(cpu_ns perf "$PERF")
kill -INT "$PERF"
kill -TERM "$NODE"
wait "$PERF" "$NODE" 2>/dev/null || true
grep -q 'perf events attached' "$TMP/node.log" || { echo "agent did not start:"; cat "$TMP/node.log"; exit 1; }
awk -v an="$a_node" -v bn="$b_node" -v ap="$a_perf" -v bp="$b_perf" -v s="$SECS" 'BEGIN{
	n = (bn - an) / 1e6 / s; p = (bp - ap) / 1e6 / s
	printf "CPU node %.3f ms/s  perf %.3f ms/s  ratio %.2fx\n", n, p, n / p
}'
printf 'load average after: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"

# Samples per comm label over the agent's whole run (gzipped profile.proto:
# sample = 2, its value = 2 and label = 3, string_table = 6).
python3 - "$TMP"/profiles/*.pb.gz <<'EOF'
import collections, gzip, sys
def varint(b, i):
    r = s = 0
    while True:
        c = b[i]; i += 1; r |= (c & 0x7f) << s; s += 7
        if c < 0x80:
            return r, i
def fields(b):
    i = 0
    while i < len(b):
        k, i = varint(b, i)
        f, w = k >> 3, k & 7
        if w == 0:
            v, i = varint(b, i)
        elif w == 2:
            n, i = varint(b, i); v = b[i:i + n]; i += n
        else:
            n = 8 if w == 1 else 4; v = b[i:i + n]; i += n
        yield f, w, v
total = collections.Counter()
for path in sys.argv[1:]:
    b = gzip.open(path).read()
    strings = [v.decode(errors="replace") for f, _, v in fields(b) if f == 6]
    for f, _, v in fields(b):
        if f != 2:
            continue
        value, comm = 0, None
        for sf, sw, sv in fields(v):
            if sf == 2 and value == 0:
                value = varint(sv, 0)[0] if sw == 2 else sv
            elif sf == 3:
                label = {lf: lv for lf, _, lv in fields(sv)}
                if strings[label.get(1, 0)] == "comm":
                    comm = strings[label.get(2, 0)]
        total[comm] += value
print(f"SAMPLES node {len(sys.argv) - 1} files: " + ", ".join(f"{c} {n}" for c, n in total.most_common(3)))
EOF
printf 'SAMPLES perf: %s\n' "$(perf report -i "$TMP/perf.data" --sort comm --stdio -F sample,comm -g none 2>/dev/null |
	awk '!/^#/ && NF == 2 {print $1, $2}' | sort -rn | awk 'NR <= 3 {print $2, $1}' | paste -sd, | sed 's/,/, /g')"
