// The in-kernel cost of sampling, seen from the sampled program
// (receivers/benches/sample_cost.sh). Spins argv[1] seconds of wall time
// in gaps_leaf <- gaps_mid <- gaps_top <- main, reading the clock in a
// tight loop. An interval between two reads longer than GAP_MIN_NS is
// time the CPU spent elsewhere: a timer tick, a profiler's sample (the
// timer interrupt, the stack walk, the BPF program or perf's copy into its
// ring), the hypervisor. Intervals longer than GAP_MAX_NS are counted
// apart: another task or the host took the CPU, not an interrupt.
// Prints "gaps <count> <ns> long <count> <ns>". Build with frame pointers
// so both profilers walk the same user stack:
//
//     cc -O2 -fno-omit-frame-pointer -fno-inline -o /tmp/gaps gaps.c
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

// A read of the vDSO clock takes ~20-40 ns; an interrupt takes longer.
#define GAP_MIN_NS 500
#define GAP_MAX_NS 200000

static inline uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t gaps, gap_ns, long_gaps, long_ns;

__attribute__((noinline)) void gaps_leaf(uint64_t end)
{
	uint64_t last = now_ns();
	while (last < end) {
		uint64_t t = now_ns(), d = t - last;
		if (d > GAP_MAX_NS) {
			long_gaps++;
			long_ns += d;
		} else if (d > GAP_MIN_NS) {
			gaps++;
			gap_ns += d;
		}
		last = t;
	}
}

__attribute__((noinline)) void gaps_mid(uint64_t end) { gaps_leaf(end); }
__attribute__((noinline)) void gaps_top(uint64_t end) { gaps_mid(end); }

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 3.0;
	gaps_top(now_ns() + (uint64_t)(seconds * 1e9));
	printf("gaps %llu %llu long %llu %llu\n", (unsigned long long)gaps, (unsigned long long)gap_ns,
	       (unsigned long long)long_gaps, (unsigned long long)long_ns);
	return 0;
}
