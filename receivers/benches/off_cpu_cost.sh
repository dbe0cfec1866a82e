#!/usr/bin/env bash
# What following threads off CPU costs the threads followed: a pipe
# ping-pong (two threads on CPU 0 passing a byte back and forth, every pass
# two context switches) timed without an agent, with the agent and
# `off_cpu: {threshold: 1ms}`, and with `off_cpu: {threshold: 0s}` (every
# wait a record), RUNS interleaved runs each, medians. The agent samples
# the whole host (no pid filter) at 19 Hz. Then the in-kernel time per run
# of the two off-CPU programs (kernel.bpf_stats_enabled): sched_switch's
# per context switch, sys_exit's per syscall exit.
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
cleanup() {
	[ -z "$AGENT" ] || kill "$AGENT" 2>/dev/null || true
	wait 2>/dev/null || true
	sysctl -qw kernel.bpf_stats_enabled="${STATS_WAS:-0}" || true
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
int main(int argc, char **argv) {
	double secs = atof(argv[1]);
	if (pipe(ab) || pipe(ba)) return 1;
	/* Both on CPU 0: every pass switches straight from one to the other. */
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(0, &set);
	sched_setaffinity(0, sizeof(set), &set);
	pthread_t t;
	pthread_create(&t, 0, pong, 0);
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	long passes = 0;
	char c = 'x';
	for (;;) {
		if (write(ab[1], &c, 1) != 1 || read(ba[0], &c, 1) != 1) return 1;
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

STATS_WAS=$(sysctl -n kernel.bpf_stats_enabled)
sysctl -qw kernel.bpf_stats_enabled=1
declare -A RATES
run() { # NAME (none: no agent)
	local rate
	if [ "$1" != none ]; then
		"$BIN" --config "$WORK/$1.yaml" >"$WORK/$1.log" 2>&1 &
		AGENT=$!
		sleep 3
		read -r s0 n0 < <(prog_named "$AGENT" profcol_off_cpu_switch)
		read -r x0 m0 < <(prog_named "$AGENT" profcol_off_cpu)
	fi
	rate=$("$WORK/pingpong" "$SECS")
	if [ "$1" != none ]; then
		read -r s1 n1 < <(prog_named "$AGENT" profcol_off_cpu_switch)
		read -r x1 m1 < <(prog_named "$AGENT" profcol_off_cpu)
		echo "$1 $((s1 - s0)) $((n1 - n0)) $((x1 - x0)) $((m1 - m0))" >>"$WORK/kernel"
		kill "$AGENT"
		wait "$AGENT" 2>/dev/null || true
		AGENT=""
	fi
	RATES[$1]="${RATES[$1]:-} $rate"
}
for _ in $(seq "$RUNS"); do
	run none
	run on
	run zero
done
python3 - "${RATES[none]}" "${RATES[on]}" "${RATES[zero]}" "$WORK/kernel" "$SECS" <<'PY'
import statistics, sys
none, on, zero = ([float(x) for x in a.split()] for a in sys.argv[1:4])
m = statistics.median
print(f"pipe ping-pong on one CPU, passes/s (two context switches each), medians of {len(none)} interleaved {sys.argv[5]} s runs:")
print(f"  no agent {m(none):,.0f}; off_cpu threshold 1ms {m(on):,.0f} ({m(on) / m(none):.3f}x); threshold 0 {m(zero):,.0f} ({m(zero) / m(none):.3f}x)")
k = {}
for line in open(sys.argv[4]):
    name, sw_ns, sw_n, ex_ns, ex_n = line.split()
    a = k.setdefault(name, [0, 0, 0, 0])
    for i, v in enumerate((sw_ns, sw_n, ex_ns, ex_n)):
        a[i] += int(v)
for name, (sw_ns, sw_n, ex_ns, ex_n) in sorted(k.items()):
    print(f"  in the kernel, {name}: sched_switch program {sw_ns / max(sw_n, 1):,.0f} ns per switch ({sw_n:,} runs), sys_exit program {ex_ns / max(ex_n, 1):,.0f} ns per syscall exit ({ex_n:,} runs)")
PY
