#!/usr/bin/env bash
# `max_cpu` over two busy CPUs at 999 Hz, side by side with `perf record
# -F 999 -a -g` at the same time, each in its own cgroup: the agent's CPU
# (its cgroup, plus its BPF programs' run time from bpf_stats, which the
# kernel charges to the sampled tasks) against the budget, steady state
# apart from start-up, and the profiles' totals (samples × each profile's
# period, over the busy processes) against the CPU time those processes
# used (/proc/PID/stat) over the same window.
#
#   sudo receivers/benches/budget_cost.sh               (BUDGET=1%, WINDOW=120)
#
# Needs root, bpftool, perf and a release build (cargo build --release -p profcol).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/profcol}
BUDGET=${BUDGET:-1%}
WINDOW=${WINDOW:-120}
START=${START:-20}
[ -x "$BIN" ] || { echo "build first: cargo build --release -p profcol" >&2; exit 1; }
command -v bpftool >/dev/null || { echo "needs bpftool" >&2; exit 1; }
command -v perf >/dev/null || { echo "needs perf (linux-perf)" >&2; exit 1; }
. receivers/benches/cgroup_cpu.sh
. receivers/benches/bpf_stats.sh

WORK=$(mktemp -d)
PIDS=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	sysctl -qw kernel.bpf_stats_enabled="${STATS_WAS:-0}" || true
	cg_remove
	rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/agent.yaml" <<EOF
receivers:
  ebpf:
    sample_frequency: 999
    report_interval: 10s
    count_in_kernel: true
    max_cpu: $BUDGET
exporters:
  file:
    path: $WORK/profiles.jsonl
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [ebpf]
      exporters: [file]
EOF

busy_ns() { # CPU ns of the busy processes so far
	for p in "${busy[@]}"; do echo "/proc/$p/stat"; done | xargs awk '{ s += ($14 + $15) * 10000000 } END { printf "%.0f\n", s }'
}
STATS_WAS=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
busy=()
for i in 1 2; do
	sh -c 'while :; do :; done' &
	busy+=($!)
	PIDS+=($!)
done
ws=$(busy_ns)
(start_in agent "$BIN" --config "$WORK/agent.yaml" >"$WORK/agent.log" 2>&1) &
PIDS+=($!)
(start_in perf perf record -q -F 999 -a -g -o "$WORK/perf.data" >/dev/null 2>&1) &
PIDS+=($!)
sleep 2
agent=$(pgrep -f -- "--config $WORK/agent.yaml" | head -1)
perfp=$(pgrep -f -- "-o $WORK/perf.data" | head -1)
sleep $((START - 2))
t0=$(date +%s%N)
a0=$(cpu_ns agent "$agent")
b0=$(bpf_ns "$agent")
p0=$(cpu_ns perf "$perfp")
w0=$(busy_ns)
sleep "$WINDOW"
t1=$(date +%s%N)
a1=$(cpu_ns agent "$agent")
b1=$(bpf_ns "$agent")
p1=$(cpu_ns perf "$perfp")
w1=$(busy_ns)
# Stopped, the agent writes its last report: its profiles cover its whole run.
kill -TERM "$agent"
kill -INT "$perfp"
we=$(busy_ns)
while kill -0 "$agent" 2>/dev/null || kill -0 "$perfp" 2>/dev/null; do sleep 0.2; done
# perf's estimate for the busy processes over its run: its samples of them / 999 Hz.
pattern=$(printf '%s|' "${busy[@]}")
perf_busy=$(perf script -F pid -i "$WORK/perf.data" 2>/dev/null | grep -cwE "${pattern%|}" || true)
python3 - "$BUDGET" "$t0" "$t1" "$a0" "$a1" "$b0" "$b1" "$p0" "$p1" "$ws" "$we" "$WORK/profiles.jsonl" "$perf_busy" "${busy[@]}" <<'EOF'
import json, sys
budget = float(sys.argv[1].rstrip("%")) / 100
t0, t1, a0, a1, b0, b1, p0, p1, w0, w1 = (int(float(x)) for x in sys.argv[2:12])
perf_busy = int(sys.argv[13]) / 999
busy = {int(p) for p in sys.argv[14:]}
wall = t1 - t0
agent = (a1 - a0) / wall
bpf = (b1 - b0) / wall
perf = (p1 - p0) / wall
total, periods = 0, {}
for line in open(sys.argv[12]):
    doc = json.loads(line)
    for rp in doc.get("resourceProfiles", []):
        attrs = {a["key"]: a["value"] for a in rp.get("resource", {}).get("attributes", [])}
        pid = int(attrs.get("process.pid", {}).get("intValue", -1))
        if pid not in busy:
            continue
        for sp in rp.get("scopeProfiles", []):
            for p in sp.get("profiles", []):
                period = int(p.get("period", 0))
                for s in p.get("samples", []):
                    n = len(s.get("timestampsUnixNano", [])) or sum(int(v) for v in s.get("values", []))
                    total += n * period
                    periods[period] = periods.get(period, 0) + n
hz = sorted(round(1e9 / p) for p in periods)
print(f"budget {budget * 100:.1f}% of one CPU; CPU over {wall / 1e9:.0f} s after start-up:")
print(f"  agent: cgroup {agent * 100:.2f}% + BPF {bpf * 100:.2f}% = {(agent + bpf) * 100:.2f}% of one CPU ({(agent + bpf) / budget:.2f}x the budget); perf record -F 999 -a -g: cgroup {perf * 100:.2f}%")
print(f"  frequencies used: {hz} Hz")
print(f"  profiles' totals for the busy processes (samples x period, the agent's whole run): {total / 1e9:.1f} s; their CPU over that run {(w1 - w0) / 1e9:.1f} s, ratio {total / (w1 - w0):.3f}")
print(f"  perf record's for them (samples / 999 Hz over its run, started and stopped with the agent): {perf_busy:.1f} s")
EOF
