#!/usr/bin/env bash
# What walking Python frames costs, side by side in one run: two agents at
# the same time over the same load, one with `interpreters: [python]` (the
# default) and one with `interpreters: []`, each in its own cgroup (CPU and
# anon + kernel memory, as a cluster charges them), and the in-kernel time
# per sample of each one's sampling program (kernel.bpf_stats_enabled: the
# entry program's run time includes the table walk and the Python walk it
# tail-calls). Then what a Python process pays: the wall time of a fixed
# Python benchmark with the Python-walking agent at 99 Hz against without
# any agent, RUNS interleaved runs each, medians.
#
#   sudo receivers/benches/python_cost.sh                  (MODE=default)
#   sudo MODE=samples WINDOW=60 RUNS=7 receivers/benches/python_cost.sh
#
# MODE=default: the embedded default's sampling (19 Hz, a report a minute,
# counting in the kernel), WINDOW 130 s (two reports); MODE=samples: the
# per-sample config (99 Hz, 10 s reports, a record per sample). The
# Python process's slow-down is always timed at 99 Hz.
#
# Load: four busy CPython processes (pyenv 3.9, 3.11, 3.12, 3.13 when
# present, else python3) running nested functions and a C extension.
# Needs root, bpftool, a release build (cargo build --release -p profcol).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/profcol}
MODE=${MODE:-default}
RUNS=${RUNS:-5}
[ -x "$BIN" ] || { echo "build first: cargo build --release -p profcol" >&2; exit 1; }
command -v bpftool >/dev/null || { echo "needs bpftool" >&2; exit 1; }
. receivers/benches/cgroup_cpu.sh
. receivers/benches/bpf_stats.sh
. receivers/benches/two_agents.sh
mode_settings "$MODE"

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

cat >"$WORK/load.py" <<'EOF'
import json, sys
def leaf(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
def middle(n):
    return leaf(n) + leaf(n // 2)
def top():
    data = [{"k": i, "v": [1, 2, 3]} for i in range(500)]
    while True:
        middle(50000)
        json.dumps(data)
top()
EOF
# A fixed amount of Python work: the benchmark whose wall time is timed.
cat >"$WORK/fixed.py" <<'EOF'
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
def run():
    total = 0
    for _ in range(8):
        total += fib(30)
    return total
run()
EOF

pythons=()
root=$(pyenv root 2>/dev/null || echo "${PYENV_ROOT:-}")
for v in 3.9 3.11 3.12 3.13; do
	p=$(ls -d "$root"/versions/"$v".*/bin/python"$v" 2>/dev/null | head -1 || true)
	pythons+=("${p:-python3}")
done
echo "load: ${pythons[*]}"

agent_config on "    interpreters: [python]"
agent_config off "    interpreters: []"
(FREQ=99 agent_config slow "    interpreters: [python]")

STATS_WAS=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1

for p in "${pythons[@]}"; do
	"$p" "$WORK/load.py" &
	PIDS+=($!)
done
sleep 1
agents_start on off
agents_window on off
kill -USR1 "$MEMP"
sleep 0.5

python3 - "$WINDOW" "${CPU[on]}" "${CPU[off]}" "${KERNEL_NS[on]}" "${KERNEL_RUNS[on]}" "${KERNEL_NS[off]}" "${KERNEL_RUNS[off]}" \
	"$WORK/mem" <<'EOF'
import sys
w = float(sys.argv[1])
c = [int(x) for x in sys.argv[2:8]]
on_cpu, off_cpu = c[0], c[1]
def per(t, n):
    return t / n if n else float("nan"), n
on_k, on_n = per(*c[2:4])
off_k, off_n = per(*c[4:6])
mem = {}
for line in open(sys.argv[8]):
    f = line.split()
    if f[0] == "mark":
        mem[f[1]] = (int(f[2]) / 2**20, int(f[3]) / 2**20, int(f[4]) / 2**20, int(f[5]) / 1024)
print(f"agent CPU over {w:.0f} s after 10 s of start-up (cgroup): interpreters on {on_cpu:,.0f} us/s, off {off_cpu:,.0f} us/s, ratio {on_cpu / off_cpu:.2f}")
print(f"in-kernel time per sample (bpf_stats, sampling program and its tail calls): on {on_k:,.0f} ns over {on_n} samples, off {off_k:,.0f} ns over {off_n}, ratio {on_k / off_k:.2f}")
for t in ("on", "off"):
    if t in mem:
        p, a, k, r = mem[t]
        print(f"peak anon+kernel {t}: {p:.1f} MiB (anon {a:.1f}, kernel {k:.1f}); peak RSS {r:.1f} MiB")
EOF

# What a Python process pays: no agent against the Python-walking agent,
# interleaved; the load and the other agent stopped first.
for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
wait 2>/dev/null || true
PIDS=()
PY=${pythons[1]}
timed() {
	python3 -c 'import subprocess, sys, time
t = time.perf_counter(); subprocess.run(sys.argv[1:], check=True); print(f"{time.perf_counter() - t:.4f}")' "$PY" "$WORK/fixed.py"
}
without=()
with=()
for i in $(seq 1 "$RUNS"); do
	without+=("$(timed)")
	"$BIN" --config "$WORK/slow.yaml" >/dev/null 2>&1 &
	A=$!
	PIDS=($A)
	sleep 3
	# Warm: the interpreter's unwind table built and its file known, as
	# for every Python process after the first on a host.
	"$PY" "$WORK/fixed.py"
	with+=("$(timed)")
	kill "$A"
	wait "$A" 2>/dev/null || true
	PIDS=()
done
python3 - "${without[*]}" "${with[*]}" "$PY" <<'EOF'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"fixed Python benchmark ({sys.argv[3]}), medians of {len(a)} interleaved runs: without agent {ma:.3f} s, with the agent at 99 Hz walking Python {mb:.3f} s: {100 * (mb / ma - 1):+.1f}%")
EOF
