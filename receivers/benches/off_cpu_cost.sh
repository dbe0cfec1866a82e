#!/usr/bin/env bash
# What following threads off CPU costs the threads followed: a pipe
# ping-pong (two threads passing a byte back and forth) timed without an
# agent, with the agent and `off_cpu: {threshold: 1ms}`, and with
# `off_cpu: {threshold: 0s}` (every wait a record), RUNS interleaved runs
# each, medians, in two placements:
#   same   both threads on CPU 0: each pass switches straight from one to
#          the other (two context switches, the harshest case);
#   paced  as same, with a fixed amount of work (a counting loop) per pass
#          sized so that without an agent the host makes about 100,000
#          context switches a second (sized once, without an agent);
#   cross  one thread on CPU 0, one on CPU 1: each pass wakes the other
#          CPU (four switches, to and from idle; slow in a VM).
# Context switches a second are the host's (/proc/stat ctxt) over each
# no-agent run. The agent samples the whole host (no pid filter) at 19 Hz.
# Throughput runs keep kernel.bpf_stats_enabled off (it adds clock reads
# to every program run); then one run per config with it on gives the
# in-kernel time of the off-CPU programs: sched_switch's per context
# switch, sched_waking's per wakeup, sys_exit's per syscall exit.
#
#   sudo receivers/benches/off_cpu_cost.sh            (RUNS=5, SECONDS_PER_RUN=5)
#
# Needs root, gcc, bpftool and a release build (cargo build --release -p profcol).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-target/release/profcol}
RUNS=${RUNS:-5}
SECS=${SECONDS_PER_RUN:-5}
[ -x "$BIN" ] || { echo "build first: cargo build --release -p profcol" >&2; exit 1; }
command -v bpftool >/dev/null || { echo "needs bpftool" >&2; exit 1; }
. receivers/benches/bpf_stats.sh
. receivers/benches/two_agents.sh

WORK=$(mktemp -d)
AGENT=""
STATS_WAS=$(sysctl -n kernel.bpf_stats_enabled)
cleanup() {
	[ -z "$AGENT" ] || kill "$AGENT" 2>/dev/null || true
	wait 2>/dev/null || true
	sysctl -qw kernel.bpf_stats_enabled="$STATS_WAS" || true
	rm -rf "$WORK"
}
trap cleanup EXIT

cat >"$WORK/pingpong.c" <<'C'
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
static int ab[2], ba[2];
static volatile int running = 1;
static void *pong(void *a) {
	char c;
	while (read(ab[0], &c, 1) == 1 && write(ba[1], &c, 1) == 1) {}
	return a;
}
static int cross;
static void *pong_on(void *a) {
	/* cross: the other thread on CPU 1. */
	if (cross) {
		cpu_set_t set;
		CPU_ZERO(&set);
		CPU_SET(1, &set);
		sched_setaffinity(0, sizeof(set), &set);
	}
	return pong(a);
}
int main(int argc, char **argv) {
	double secs = atof(argv[1]);
	cross = argc > 2 && argv[2][0] == 'c';
	/* Work per pass: iterations of a counting loop. */
	long work = argc > 3 ? atol(argv[3]) : 0;
	volatile long sink = 0;
	if (pipe(ab) || pipe(ba)) return 1;
	/* same: both on CPU 0, every pass switches straight from one to the
	 * other; cross: this one on CPU 0. */
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(0, &set);
	sched_setaffinity(0, sizeof(set), &set);
	pthread_t t;
	pthread_create(&t, 0, pong_on, 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	long passes = 0;
	char c = 'x';
	for (;;) {
		if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1) return 1;
		for (long i = 0; i < work; i++)
			sink += i;
		passes++;
		if ((passes & 1023) == 0) {
			clock_gettime(CLOCK_MONOTONIC, &t1);
			if ((t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9 >= secs) break;
		}
	}
	double el = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	printf("%.0f\n", passes / el);
	return 0;
}
C
gcc -O2 -pthread -o "$WORK/pingpong" "$WORK/pingpong.c"

FREQ=19 REPORT=10s COUNT=""
agent_config on "    off_cpu:
      threshold: 1ms"
agent_config zero "    off_cpu:
      threshold: 0s"

ctxt() { awk '/^ctxt/ {print $2}' /proc/stat; }
declare -A RATES SWITCHES
agent_up() { # NAME
	"$BIN" --config "$WORK/$1.yaml" >"$WORK/$1.log" 2>&1 &
	AGENT=$!
	sleep 3
	kill -0 "$AGENT" || { cat "$WORK/$1.log" >&2; exit 1; }
}
agent_down() {
	kill "$AGENT"
	wait "$AGENT" 2>/dev/null || true
	AGENT=""
}
# Work per pass for `paced`: pass time is linear in it; two runs without
# an agent give the line, solved for 100,000 switches/s (50,000 passes/s).
r0=$("$WORK/pingpong" 2 same 0)
r1=$("$WORK/pingpong" 2 same 20000)
PACE=$(python3 -c "a=1/$r0; b=(1/$r1-a)/20000; print(max(0, round((1/50000-a)/b)))")
work_of() { [ "$1" = paced ] && echo "$PACE" || echo 0; }
run() { # NAME (none: no agent) PLACEMENT
	local rate c0 c1 t0 t1 mode=$2
	[ "$mode" = paced ] && mode=same
	[ "$1" = none ] || agent_up "$1"
	c0=$(ctxt)
	t0=$(date +%s%N)
	rate=$("$WORK/pingpong" "$SECS" "$mode" "$(work_of "$2")")
	t1=$(date +%s%N)
	c1=$(ctxt)
	[ "$1" = none ] || agent_down
	RATES[$1-$2]="${RATES[$1-$2]:-} $rate"
	SWITCHES[$1-$2]="${SWITCHES[$1-$2]:-} $(((c1 - c0) * 1000000000 / (t1 - t0)))"
}
sysctl -qw kernel.bpf_stats_enabled=0
for _ in $(seq "$RUNS"); do
	for where in same paced cross; do
		run none "$where"
		run on "$where"
		run zero "$where"
	done
done
# In-kernel time: one run per config, stats on.
sysctl -qw kernel.bpf_stats_enabled=1
for name in on zero; do
	agent_up "$name"
	for p in profcol_off_cpu_switch profcol_off_cpu_waking profcol_off_cpu; do
		read -r "ns0_$p" "n0_$p" < <(prog_named "$AGENT" "$p")
	done
	"$WORK/pingpong" "$SECS" same >/dev/null
	line="$name"
	for p in profcol_off_cpu_switch profcol_off_cpu_waking profcol_off_cpu; do
		read -r ns1 n1 < <(prog_named "$AGENT" "$p")
		ns0="ns0_$p" n0="n0_$p"
		line="$line $((ns1 - ${!ns0})) $((n1 - ${!n0}))"
	done
	echo "$line" >>"$WORK/kernel"
	agent_down
done
python3 - "$WORK/kernel" "$SECS" "$RUNS" \
	"${RATES[none-same]}" "${RATES[on-same]}" "${RATES[zero-same]}" "${SWITCHES[none-same]}" \
	"${RATES[none-paced]}" "${RATES[on-paced]}" "${RATES[zero-paced]}" "${SWITCHES[none-paced]}" \
	"${RATES[none-cross]}" "${RATES[on-cross]}" "${RATES[zero-cross]}" "${SWITCHES[none-cross]}" <<'PY'
import statistics, sys
m = statistics.median
kernel, secs, runs = sys.argv[1:4]
nums = [[float(x) for x in a.split()] for a in sys.argv[4:]]
print(f"pipe ping-pong, passes/s, medians of {runs} interleaved {secs} s runs (stats off):")
for where, (none, on, zero, sw) in (("same CPU", nums[0:4]), ("same CPU, paced", nums[4:8]), ("two CPUs", nums[8:12])):
    print(f"  {where}, {m(sw):,.0f} context switches/s without an agent: no agent {m(none):,.0f}; "
          f"off_cpu threshold 1ms {m(on):,.0f} ({m(on) / m(none):.3f}x); threshold 0 {m(zero):,.0f} ({m(zero) / m(none):.3f}x)")
for line in open(kernel):
    name, *v = line.split()
    sw_ns, sw_n, wk_ns, wk_n, ex_ns, ex_n = map(int, v)
    print(f"  in the kernel (same CPU, stats on), threshold {'1ms' if name == 'on' else '0'}: "
          f"sched_switch {sw_ns / max(sw_n, 1):,.0f} ns per switch ({sw_n:,} runs), "
          f"sched_waking {wk_ns / max(wk_n, 1):,.0f} ns per wakeup ({wk_n:,}), "
          f"sys_exit {ex_ns / max(ex_n, 1):,.0f} ns per syscall exit ({ex_n:,})")
PY
