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
. receivers/benches/two_agents.sh
REPORT=10s
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

agent_config both "    targets:
      include: [{cgroup_path: /$A}, {cgroup_path: /$B}]"
agent_config one "    targets:
      include: [{cgroup_path: /$A}]"

STATS_WAS=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
mkdir "$V2/$A" "$V2/$B"
for g in "$A" "$B"; do
	sh -c 'echo $$ >"$0/cgroup.procs" && exec python3 "$1"' "$V2/$g" "$WORK/load.py" &
	PIDS+=($!)
done
agents_start both one
agents_window both one
python3 - "$WINDOW" "$FREQ" "${KERNEL_NS[both]}" "${KERNEL_RUNS[both]}" "${KERNEL_NS[one]}" "${KERNEL_RUNS[one]}" "${CPU[both]}" "${CPU[one]}" <<'EOF'
import sys
w = float(sys.argv[1]); f = sys.argv[2]
v = [int(x) for x in sys.argv[3:]]
bk, bn = v[0] / w / 1000, v[1] / w
ok, on = v[2] / w / 1000, v[3] / w
bc, oc = v[4], v[5]
print(f"{f} Hz, {w:.0f} s after 10 s of start-up, two busy cgroups A and B:")
print(f"  in-kernel time of the sampling program: both included {bk:,.1f} us/s ({bn:,.0f} runs/s), A only {ok:,.1f} us/s ({on:,.0f} runs/s), ratio {ok / bk:.2f}")
print(f"  agent CPU (cgroup): both included {bc:,.0f} us/s, A only {oc:,.0f} us/s, ratio {oc / bc:.2f}")
EOF
