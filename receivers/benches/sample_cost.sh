#!/usr/bin/env bash
# In-kernel cost per sample: what the sampled program pays, profcol's node
# agent against `perf record -e cpu-clock -a -g`, interleaved in one run.
#
#   sudo receivers/benches/sample_cost.sh                   # 5 rounds, 4999 Hz, 5 s
#   FREQ=999 ROUNDS=9 sudo receivers/benches/sample_cost.sh
#   PROFCOL_BIN=path/to/profcol sudo -E receivers/benches/sample_cost.sh
#
# Neither profiler's sampling work is charged to its own process: the timer
# interrupt, the stack walks, and then perf's copy of the sample into its
# ring or profcol's BPF program (counting the stack in the kernel) run on
# the sampled CPU, in the time of whatever runs there. So this bench
# measures it from there: examples/workloads/gaps.c spins on CPU $CPU in a
# 4-deep call chain reading the clock in a tight loop, and sums the
# intervals between two reads that are longer than 0.5 µs and shorter than
# 200 µs (interrupts; longer ones are another task or the host and are
# reported apart). Each round runs the workload three times, the profilers
# on the other CPU (taskset $AGENT_CPU):
#   - none:  no profiler (the ticks and the hypervisor's own interrupts);
#   - perf:  perf record -e cpu-clock -F FREQ -a -g (the same clock event
#            profcol uses; Debian linux-perf);
#   - node:  the profcol binary with examples/default.yaml at FREQ.
# A profiler's cost per sample is (its gap time - none's gap time of the
# same round) / (FREQ x SECS): the workload is always running, so every
# timer expiry on its CPU is one sample. Each profiler runs WARMUP seconds
# and the workload once before the measured run (a run of profcol's
# unwinder builds the workload's table then, as on a host that has seen
# the binary before). kernel.bpf_stats_enabled is on for the run (its
# setting is restored at exit), and the node runs print the BPF program's
# own run time per call beside their gaps.
# Lines: ROUND (one per case per round), then MEDIAN and RATIO.
# Needs root, cc, perf, bpftool.
set -euo pipefail
cd "$(dirname "$0")/../.."

FREQ=${FREQ:-4999}
SECS=${SECS:-5}
ROUNDS=${ROUNDS:-5}
WARMUP=${WARMUP:-2}
CPU=${CPU:-1}
AGENT_CPU=${AGENT_CPU:-0}
TMP=$(mktemp -d)
AGENT=""
STATS_WAS=$(cat /proc/sys/kernel/bpf_stats_enabled)
cleanup() {
	[ -n "$AGENT" ] && kill "$AGENT" 2>/dev/null
	wait 2>/dev/null || true
	echo "$STATS_WAS" >/proc/sys/kernel/bpf_stats_enabled
	rm -rf "$TMP"
	true
}
trap cleanup EXIT

if [ -z "${PROFCOL_BIN:-}" ]; then
	cargo build --release -q -p profcol --bin profcol
fi
BIN=${PROFCOL_BIN:-${CARGO_TARGET_DIR:-target}/release/profcol}
cc -O2 -fno-omit-frame-pointer -fno-inline -o "$TMP/gaps" examples/workloads/gaps.c
# shellcheck source=receivers/benches/node_config.sh
. receivers/benches/node_config.sh
node_config "$FREQ" "$TMP" '""' >"$TMP/node.yaml"

# The BPF program's run time and runs so far (bpf_stats), summed over
# profcol's sampling programs.
bpf_stats() {
	bpftool prog show -j | python3 -c '
import json, sys
ns = runs = 0
for p in json.load(sys.stdin):
    if p.get("type") == "perf_event" and p.get("name", "").startswith("profcol"):
        ns += p.get("run_time_ns", 0); runs += p.get("run_cnt", 0)
print(ns, runs)'
}

start_profiler() {
	case $1 in
	none) AGENT="" ;;
	perf)
		taskset -c "$AGENT_CPU" perf record -e cpu-clock -F "$FREQ" -a -g -o "$TMP/perf.data" >"$TMP/perf.log" 2>&1 &
		AGENT=$!
		;;
	node)
		taskset -c "$AGENT_CPU" "$BIN" --config "$TMP/node.yaml" >"$TMP/node.log" 2>&1 &
		AGENT=$!
		;;
	esac
	sleep "$WARMUP"
	if [ -n "$AGENT" ] && ! kill -0 "$AGENT" 2>/dev/null; then
		echo "$1 exited early:"
		cat "$TMP/$1.log"
		exit 1
	fi
	[ "$1" = node ] && { grep -q 'perf events attached' "$TMP/node.log" || { echo "node agent did not start:"; cat "$TMP/node.log"; exit 1; }; }
	taskset -c "$CPU" "$TMP/gaps" 1 >/dev/null
}

stop_profiler() {
	[ -z "$AGENT" ] && return
	kill -INT "$AGENT"
	wait "$AGENT" 2>/dev/null || true
	AGENT=""
	rm -f "$TMP/perf.data"
}

printf 'load average before: %s\n' "$(cut -d' ' -f1-3 /proc/loadavg)"
RESULTS=$TMP/results
: >"$RESULTS"
echo 1 >/proc/sys/kernel/bpf_stats_enabled
for round in $(seq "$ROUNDS"); do
	for t in none perf node; do
		start_profiler "$t"
		read -r b_ns b_runs < <([ "$t" = node ] && bpf_stats || echo "0 0")
		read -r _ gaps gap_ns _ long long_ns < <(taskset -c "$CPU" "$TMP/gaps" "$SECS")
		read -r a_ns a_runs < <([ "$t" = node ] && bpf_stats || echo "0 0")
		stop_profiler
		echo "$round $t $gaps $gap_ns $long $long_ns $((a_ns - b_ns)) $((a_runs - b_runs))" >>"$RESULTS"
		awk -v r="$round" -v t="$t" -v g="$gaps" -v ns="$gap_ns" -v l="$long" -v lns="$long_ns" \
			-v bns="$((a_ns - b_ns))" -v bruns="$((a_runs - b_runs))" 'BEGIN{
			printf "ROUND %d %-4s gaps %6d %8.2f ms  long %4d %8.2f ms", r, t, g, ns / 1e6, l, lns / 1e6
			if (bruns > 0) printf "  bpf %d runs, %.0f ns each", bruns, bns / bruns
			printf "\n"
		}'
	done
done

python3 - "$RESULTS" "$FREQ" "$SECS" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
samples = float(sys.argv[2]) * float(sys.argv[3])
by = {}
for r, t, gaps, ns, long, long_ns, bpf_ns, bpf_runs in rows:
    by.setdefault(r, {})[t] = (int(gaps), int(ns), int(bpf_ns), int(bpf_runs))
cost = {"perf": [], "node": []}
extra = {"perf": [], "node": []}
for r, c in sorted(by.items()):
    for t in cost:
        cost[t].append((c[t][1] - c["none"][1]) / samples)
        extra[t].append(c[t][0] - c["none"][0])
for t in cost:
    print(f"MEDIAN {t:4} {statistics.median(cost[t]):7.0f} ns per sample (rounds {', '.join(f'{x:.0f}' for x in cost[t])});"
          f" extra gaps per round {statistics.median(extra[t]):.0f} of {samples:.0f} samples")
bpf = [c["node"][2] / c["node"][3] for c in by.values() if c["node"][3]]
if bpf:
    print(f"MEDIAN node's BPF program {statistics.median(bpf):.0f} ns per run (bpf_stats; rounds {', '.join(f'{x:.0f}' for x in bpf)})")
ratios = [n / p for n, p in zip(cost["node"], cost["perf"]) if p > 0]
print(f"RATIO node/perf in-kernel per sample {statistics.median(cost['node']) / statistics.median(cost['perf']):.2f}x"
      f" (per round {', '.join(f'{x:.2f}' for x in ratios)})")
EOF
