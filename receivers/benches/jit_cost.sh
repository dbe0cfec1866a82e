#!/usr/bin/env bash
# What naming JIT frames costs, side by side in one run: two agents at the
# same time over the same load, one with `jit.perf_maps: true` (the
# default) and one with it off, each in its own cgroup (CPU, and anon +
# kernel memory at its peak, as a cluster charges them; RSS beside it).
#
#   sudo receivers/benches/jit_cost.sh                 (MODE=default)
#   sudo MODE=samples WINDOW=60 receivers/benches/jit_cost.sh
#
# MODE=default: the embedded default's sampling (19 Hz, a report a minute,
# counting in the kernel), WINDOW 130 s (two reports); MODE=samples: the
# per-sample config (99 Hz, 10 s reports, a record per sample).
#
# Load: four node processes with --perf-basic-prof, each running hot
# functions and compiling a new one every 50 ms, so each map grows while
# it is read.
# Needs root, node and a release build (cargo build --release -p profcol).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/profcol}
MODE=${MODE:-default}
[ -x "$BIN" ] || { echo "build first: cargo build --release -p profcol" >&2; exit 1; }
command -v node >/dev/null || { echo "needs node" >&2; exit 1; }
. receivers/benches/cgroup_cpu.sh
. receivers/benches/two_agents.sh
mode_settings "$MODE"

WORK=$(mktemp -d)
PIDS=()
NODES=()
cleanup() {
	for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	for p in "${NODES[@]}"; do rm -f "/tmp/perf-$p.map"; done
	cg_remove
	rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/load.js" <<'JS'
function hot(n) { let s = 0; for (let i = 0; i < n; i++) { s = (s + i * i) % 1000003; } return s; }
function warm(n) { let s = 1; for (let i = 0; i < n; i++) { s = (s * 31 + i) % 999983; } return s; }
// A new function compiled now and then: the map grows as a service's does.
let made = 0;
setInterval(() => { const f = new Function("n", `let s = ${made++}; for (let i = 0; i < n; i++) s += i; return s;`); f(1000); f(1000); }, 50);
function spin() { hot(200000); warm(100000); setImmediate(spin); }
spin();
JS

agent_config on "    jit:
      perf_maps: true"
agent_config off "    jit:
      perf_maps: false"

for _ in 1 2 3 4; do
	# In $WORK: --perf-basic-prof also writes isolate-*-v8.log where it runs.
	(cd "$WORK" && exec node --perf-basic-prof load.js) &
	PIDS+=($!)
	NODES+=($!)
done
sleep 1
agents_start on off
agents_window on off
lines=$(for p in "${NODES[@]}"; do wc -l <"/tmp/perf-$p.map"; done | awk '{s += $1} END {print s}')
kill -TERM "$MEMP"
wait "$MEMP" 2>/dev/null || true
python3 - "$MODE" "$FREQ" "$WINDOW" "${CPU[on]}" "${CPU[off]}" "$lines" "$WORK/mem" <<'PY'
import sys
mode, freq, w = sys.argv[1], sys.argv[2], float(sys.argv[3])
on, off = int(sys.argv[4]), int(sys.argv[5])
lines = int(sys.argv[6])
mem = {}
for line in open(sys.argv[7]):
    f = line.split()
    if f[0] == "end":
        mem[f[1]] = (int(f[2]), int(f[5]))
print(f"{mode}: {freq} Hz, {w:.0f} s after 10 s of start-up, four node processes ({lines:,} perf map lines at the end):")
print(f"  agent CPU (cgroup): perf_maps on {on:,.0f} us/s, off {off:,.0f} us/s, ratio {on / off:.2f}")
for t in ("on", "off"):
    peak, rss = mem.get(t, (0, 0))
    print(f"  perf_maps {t}: peak anon + kernel {peak / 2**20:.1f} MiB, peak RSS {rss / 1024:.1f} MiB")
PY
