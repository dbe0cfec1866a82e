#!/usr/bin/env bash
# What `targets` saves in the kernel, side by side in one run: two busy
# processes, each in a cgroup v2 group of its own (A and B), and two agents
# at the same time over that load: one including both groups, one
# including A only. For each agent: its sampling program's in-kernel time
# per second (kernel.bpf_stats_enabled; the entry program's run time
# includes the walks it tail-calls) and its CPU (its own cgroup).
#
#   sudo receivers/benches/targets_cost.sh             (WINDOW=60, 99 Hz)
#   sudo FREQ=19 WINDOW=130 receivers/benches/targets_cost.sh
#
# Load: one CPython process per group running nested functions and a C
# extension (a native and a Python walk per sample).
# Needs root, bpftool, a mounted cgroup2 and a release build
# (cargo build --release -p profcol).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/profcol}
FREQ=${FREQ:-99}
WINDOW=${WINDOW:-60}
[ -x "$BIN" ] || { echo "build first: cargo build --release -p profcol" >&2; exit 1; }
command -v bpftool >/dev/null || { echo "needs bpftool" >&2; exit 1; }
. receivers/benches/cgroup_cpu.sh
. receivers/benches/bpf_stats.sh
V2=$(awk '$9 == "cgroup2" && $4 == "/" { print $5; exit }' /proc/self/mountinfo)
[ -n "$V2" ] || { echo "needs a mounted cgroup2 hierarchy" >&2; exit 1; }

WORK=$(mktemp -d)
PIDS=()
A=profcol-targets-$$-a
B=profcol-targets-$$-b
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	sysctl -qw kernel.bpf_stats_enabled="${STATS_WAS:-0}" || true
	rmdir "$V2/$A" "$V2/$B" 2>/dev/null || true
	cg_remove
	rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/load.py" <<'EOF'
import json
def leaf(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def middle(n):
    return leaf(n) + leaf(n // 2)
data = [{"k": i, "v": [1, 2, 3]} for i in range(500)]
while True:
    middle(50000)
    json.dumps(data)
EOF

config() { # OUT INCLUDE-LIST
	cat >"$1" <<EOF
receivers:
  ebpf:
    sample_frequency: $FREQ
    report_interval: 10s
    targets:
      include: $2
exporters:
  pprof:
    directory: $WORK/out-$(basename "$1" .yaml)
service:
  telemetry:
    metrics:
      level: none
  pipelines:
    profiles:
      receivers: [ebpf]
      exporters: [pprof]
EOF
}
config "$WORK/both.yaml" "[{cgroup_path: /$A}, {cgroup_path: /$B}]"
config "$WORK/one.yaml" "[{cgroup_path: /$A}]"

STATS_WAS=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
mkdir "$V2/$A" "$V2/$B"
for g in "$A" "$B"; do
	sh -c 'echo $$ >"$0/cgroup.procs" && exec python3 "$1"' "$V2/$g" "$WORK/load.py" &
	PIDS+=($!)
done
(start_in both "$BIN" --config "$WORK/both.yaml" >"$WORK/both.log" 2>&1) &
PIDS+=($!)
(start_in one "$BIN" --config "$WORK/one.yaml" >"$WORK/one.log" 2>&1) &
PIDS+=($!)
sleep 10
agent_pid() { pgrep -f -- "--config $WORK/$1.yaml" | head -1; }
both=$(agent_pid both)
one=$(agent_pid one)
read -r b_t0 b_n0 < <(prog_stats "$both")
read -r o_t0 o_n0 < <(prog_stats "$one")
b_c0=$(cpu_ns both "$both")
o_c0=$(cpu_ns one "$one")
sleep "$WINDOW"
read -r b_t1 b_n1 < <(prog_stats "$both")
read -r o_t1 o_n1 < <(prog_stats "$one")
b_c1=$(cpu_ns both "$both")
o_c1=$(cpu_ns one "$one")
python3 - "$WINDOW" "$FREQ" "$b_t0" "$b_n0" "$b_t1" "$b_n1" "$o_t0" "$o_n0" "$o_t1" "$o_n1" \
	"$b_c0" "$b_c1" "$o_c0" "$o_c1" <<'EOF'
import sys
w = float(sys.argv[1]); f = sys.argv[2]
v = [int(x) for x in sys.argv[3:]]
bk, bn = (v[2] - v[0]) / w / 1000, (v[3] - v[1]) / w
ok, on = (v[6] - v[4]) / w / 1000, (v[7] - v[5]) / w
bc, oc = (v[9] - v[8]) / w / 1000, (v[11] - v[10]) / w / 1000
print(f"{f} Hz, {w:.0f} s after 10 s of start-up, two busy cgroups A and B:")
print(f"  in-kernel time of the sampling program: both included {bk:,.1f} us/s ({bn:,.0f} runs/s), A only {ok:,.1f} us/s ({on:,.0f} runs/s), ratio {ok / bk:.2f}")
print(f"  agent CPU (cgroup): both included {bc:,.0f} us/s, A only {oc:,.0f} us/s, ratio {oc / bc:.2f}")
EOF
